"""A DSpark draft through a run: its config rules (the block follows the served k, the Markov
rank is its own key), eyas's trainer lowering its loss on the tiny world and writing a draft
the loader reads, the evaluate stage scoring it at k = block_size with eyas's reference engine,
its export for vLLM, and the refusal, before any stage, of a run that would serve it on a
machine whose vLLM (the CPU build's V1 runner) has no DSpark."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from eyas.config import EvalConfig
from workflows.config import ConfigError, load_config

BLOCK = 3  # k = 3: the anchor and two masks, every slot drafting
NO_SERVE = "stages=[prepare,extract,train,evaluate]"


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def test_the_block_is_the_served_k_and_the_markov_rank_its_own_key():
    cfg = load_config(["draft.family=dspark", "serve.num_speculative_tokens=5", NO_SERVE])
    assert cfg.draft.block_size == 5 and cfg.draft.markov_rank == 256
    assert load_config(["draft.family=dspark", "draft.markov_rank=32", NO_SERVE]
                       ).draft.markov_rank == 32
    for overrides, message in (
            (["draft.block_size=4"], r"draft.block_size=4 with serve.num_speculative_tokens=3"
                                     r": .* DSpark block of B as B drafted tokens"),
            (["serve.num_speculative_tokens=1"], r"draft.block_size=1: a dspark block is the "
                                                 r"anchor and at least one mask")):
        with pytest.raises(ConfigError, match=message):
            load_config(["draft.family=dspark", NO_SERVE, *overrides])
    for family in ("eagle3", "peagle", "dflash"):
        with pytest.raises(ConfigError, match=rf"draft.markov_rank=8 is a dspark draft's .*"
                                              rf"draft.family={family} has none"):
            load_config([f"draft.family={family}", "draft.markov_rank=8", NO_SERVE])
    from eyas.draft.families import get

    settings = cfg.draft
    assert get("dspark").served_k(settings, 5) == 5 == get("dspark").ttt_steps(settings,
                                                                                cfg.train)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """The tiny world and a DSpark draft eyas's trainer trained on it."""
    from eyas.train.loop import train_draft
    from helpers import tiny_train_settings, tiny_training_world

    base = tmp_path_factory.mktemp("dspark")
    w = tiny_training_world(base, slots=["block_out:0", "block_out:1", "block_out:3"])
    train, settings = tiny_train_settings()
    train = dataclasses.replace(train, epochs=6)  # 36 steps of 4 samples
    settings = dataclasses.replace(settings, family="dspark", block_size=BLOCK, num_layers=2,
                                   markov_rank=16)
    report = train_draft(str(w.offline), str(w.target), str(base / "train"), train, settings)
    return w, report, base


def test_training_lowers_the_loss_and_saves_a_draft_load_reads(trained):
    from eyas.draft.dspark.model import DSparkDraft
    from eyas.draft.load import load
    from eyas.targets.parts import target_parts

    w, report, _ = trained
    first, last = (sum(x) / len(x) for x in (report.losses[:3], report.losses[-3:]))
    assert math.isfinite(last) and last < 0.85 * first, report.losses
    loaded = load(report.draft_dir, target_parts(w.target)[0])
    assert type(loaded.draft) is DSparkDraft and loaded.draft.config.block_size == BLOCK
    assert loaded.draft.config.markov_rank == 16 and len(loaded.draft.layers) == 2
    assert len(report.train_accuracy) == BLOCK  # one accuracy per slot, the anchor's first


def test_evaluate_scores_it_at_k_equal_to_its_block(trained):
    """The evaluate stage's code (eyas.evaluate.run: standalone accuracy, the doctor, the
    reference engine's speculative decoding) on the trained draft at k = block_size, the k
    vLLM serves it with: B positions scored, B drafted per verify step, no gap alarm."""
    from eyas.evaluate.run import evaluate_run

    w, report, base = trained
    out = base / "evaluate"
    result = evaluate_run(w.offline, report.draft_dir, w.target, EvalConfig(
        num_prompts=2, max_new_tokens=12, max_train_samples=None), out, steps=BLOCK)
    assert len(result["per_position_accuracy"]["heldout"]["full"]) == BLOCK
    measured = result["measured"]
    assert measured["drafts"] > 0 and len(measured["accepted_per_position"]) == BLOCK
    assert result["doctor"]["findings"] == [], result["doctor"]  # (the tiny world's
    # evidence may leave it INCONCLUSIVE: reported, not a fault)
    profile = json.loads((out / result["profiles"]["heldout"]).read_text())
    assert (profile["method"], profile["num_speculative_tokens"], profile["block_size"]) == (
        "dspark", BLOCK, BLOCK)


def test_export_for_vllm_launches_method_dspark_and_sglang_is_refused(trained, tmp_path):
    from eyas.layout import LayoutError
    from eyas.serve.export import export_sglang, export_vllm, launch_command

    w, report, _ = trained
    vllm_dir = export_vllm(report.draft_dir, tmp_path / "vllm")
    command = launch_command("vllm", str(w.target), str(vllm_dir), BLOCK)
    assert '"method":"dspark"' in command and f'"num_speculative_tokens":{BLOCK}' in command
    with pytest.raises(LayoutError, match="a dspark draft.*export it for vLLM"):
        export_sglang(report.draft_dir, tmp_path / "sglang")


def _main(monkeypatch, capsys, gpu: bool, *overrides) -> tuple[int, str]:
    from workflows import pipeline

    def started(*args, **kwargs):
        raise AssertionError("the run started: nothing refused it before its stages")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.setattr(pipeline, "run", started)
    code = pipeline.main(list(overrides))
    return code, " ".join(capsys.readouterr().err.split())  # the paragraph, unwrapped


def test_serving_it_on_a_machine_without_a_gpu_is_refused_before_any_stage(
        tmp_path, monkeypatch, capsys):
    """`eyas run experiment=tiny draft.family=dspark` on a CPU machine: vLLM's CPU build runs
    the V1 runner, which has no DSpark; the run stops (exit 2) before any stage, naming the
    family, why and the fix, and writes nothing. Without serve it is planned; on a GPU, V2
    serves it; the reference engine is not vLLM."""
    from workflows.plan import preflight

    run_dir = tmp_path / "run"
    code, err = _main(monkeypatch, capsys, False, "experiment=tiny", "draft.family=dspark",
                      f"run_dir={run_dir}")
    assert code == 2, err
    assert err.startswith("eyas: draft.family=dspark with the serve stage (serve.engine=vllm): "
                          "DSpark exists only in the V2 runner (a GPU)"), err
    assert "V1 runner here (the CPU build has no Triton backend, so V1)" in err
    assert f"Drop serve from the stages ('{NO_SERVE}'" in err and "with a GPU" in err
    assert "Traceback" not in err and not run_dir.exists()
    preflight(load_config(["experiment=tiny", "draft.family=dspark", NO_SERVE]))
    preflight(load_config(["experiment=tiny", "draft.family=dspark", "serve.engine=reference"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    load_config(["experiment=tiny", "draft.family=dspark"])
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # a GPU forced onto V1
    with pytest.raises(ConfigError, match="VLLM_USE_V2_MODEL_RUNNER=0.*unset"):
        load_config(["experiment=tiny", "draft.family=dspark"])


def test_serving_a_dspark_draft_directory_on_a_cpu_machine_is_refused(trained, monkeypatch):
    """serve.draft=DIR: the kind its config reads as decides (a DSpark draft whatever
    draft.family says)."""
    _, report, _ = trained
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=rf"^serve.draft={report.draft_dir} \(a dspark draft\)"
                                          r" with the serve stage .* V2 runner"):
        load_config(["experiment=tiny", f"serve.draft={report.draft_dir}"])
    load_config(["experiment=tiny", f"serve.draft={report.draft_dir}", NO_SERVE])
