"""The prepare stage regenerating every assistant turn through vLLM in a Ray actor, on the
tiny built-in target (sampled: its greedy answer is blank lines), and resuming from its
cached chunks after a killed run. The first regeneration runs as a user runs it, in a
process of its own: its output shows the answers counted and no vLLM log."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import engine_log_lines, vllm_installed

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.vllm,
              pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed")]


def _prepare(run_dir, target_cache, *extra):
    from workflows import pipeline
    return pipeline.main(["experiment=tiny", f"run_dir={run_dir}", "stages=[prepare]",
                          f"target.builtin.cache_dir={target_cache}", *extra])


def _prepare_as_a_user_runs_it(run_dir, target_cache, *extra) -> str:
    """The command in a process of its own (its own local Ray, workers' output forwarded, not a
    terminal): what a user reads."""
    cmd = [sys.executable, "-m", "workflows.pipeline", "experiment=tiny", f"run_dir={run_dir}",
           "stages=[prepare]", f"target.builtin.cache_dir={target_cache}", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "EYAS_DEBUG")}
    done = subprocess.run(cmd, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_prepare_regenerates_through_vllm_and_resumes(ray_cluster, target_cache, tmp_path):
    regen = ("data.regenerate=true", "data.generation.temperature=1.0",
             "data.generation.max_new_tokens=24", "data.generation.on_truncated=keep")
    assert _prepare(tmp_path / "plain", target_cache) == 0
    printed = _prepare_as_a_user_runs_it(tmp_path / "regen", target_cache, *regen)
    out = tmp_path / "regen" / "prepare"
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["regenerated"]
    # the engine's own log stays out; a bar counts the answers as they come back
    assert not engine_log_lines(printed), engine_log_lines(printed)[:5]
    answers = [int(n) for n in re.findall(r"regenerate: (\d+) answers", printed)]
    assert answers and answers[-1] >= counts["turns"], printed[-3000:]
    assert counts["engine"].startswith("vllm 0.32") and counts["how"]["temperature"] == 1.0
    assert counts["conversations"] == 24 + 8 and counts["turns"] >= 32
    assert counts["dropped"] == counts["empty"]  # cut-off answers kept, and counted
    assert manifest["splits"]["train"]["samples"] == 24 - counts["per_split"]["train"]["dropped"]
    plain = pq.read_table(tmp_path / "plain" / "prepare" / "train.parquet").to_pylist()
    regenerated = pq.read_table(out / "train.parquet").to_pylist()
    # same prompts (the user turn opens each sample), other answers: the target's
    for a, b in zip(plain, regenerated):
        first = a["loss_mask"].index(1)
        assert a["input_ids"][:first] == b["input_ids"][:first]
    assert sum(a["input_ids"] != b["input_ids"] for a, b in zip(plain, regenerated)) >= 20
    # a killed run: the tokenized output and the stage's marker gone, the chunks cached;
    # the rerun generates nothing new (sampling is seeded per request) and writes the same
    before = (out / "train.parquet").read_bytes()
    chunks = {p.name: p.stat().st_mtime_ns for p in (out / "regenerated").iterdir()}
    assert chunks
    for name in ("train.parquet", "heldout.parquet", "manifest.json", "_COMPLETE.json"):
        (out / name).unlink()
    assert _prepare(tmp_path / "regen", target_cache, *regen) == 0
    assert (out / "train.parquet").read_bytes() == before
    assert {p.name: p.stat().st_mtime_ns for p in (out / "regenerated").iterdir()} == chunks
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_every_regeneration_replica_gets_work_in_each_round():
    """A round's prompts are dealt so that each replica has a share (pieces of 64 left six of
    eight replicas idle on a round of 100), in pieces of at most 64, covering each prompt
    once."""
    from tasks.prepare import PIECE, pieces

    for prompts, replicas in ((100, 8), (1000, 3), (5, 8), (64, 1)):
        dealt = pieces(prompts, replicas)
        assert sorted(i for _, start, end in dealt for i in range(start, end)) == list(
            range(prompts))
        assert {r for r, _, _ in dealt} == set(range(min(replicas, prompts)))
        assert max(end - start for _, start, end in dealt) <= PIECE
