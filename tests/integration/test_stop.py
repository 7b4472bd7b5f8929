"""A run stopped by SIGTERM (a scheduler's preemption, `kill`): one `eyas:` line and exit 143
instead of Ray's stack dump and an abort; what finished is untouched and the next run skips it."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _pipeline(run_dir: Path, cache: Path, stages: str) -> list[str]:
    return [sys.executable, "-m", "workflows.pipeline", "experiment=tiny", f"run_dir={run_dir}",
            f"stages={stages}", f"target.builtin.cache_dir={cache}"]


def test_sigterm_stops_with_one_line_and_the_rerun_skips_what_finished(tmp_path, target_cache):
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as out:
        proc = subprocess.Popen(_pipeline(run_dir, target_cache, "[prepare,extract,train]"),
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not (run_dir / "extract" / "_STARTED.json").exists():  # prepare is finished
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        finished = _digests(run_dir / "prepare")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    text = log.read_text()
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "eyas: stopped by SIGTERM" in text and "run the same command to resume" in text
    assert "SIGTERM received" not in text  # Ray's own handler: a stack dump and an abort
    # (a stop that lands inside a weakref callback is printed by Python as "Exception ignored"
    # and caught by the stage loop's check instead: the outcome is the same)
    assert _digests(run_dir / "prepare") == finished

    again = subprocess.run(_pipeline(run_dir, target_cache, "[prepare]"), cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "prepare    | skipped  | up to date" in again.stdout  # the lock was released too
    assert _digests(run_dir / "prepare") == finished


# A run sized so that each long stage lasts seconds on the tiny target: 25 extraction shards,
# 184 training steps with a checkpoint every 5, vLLM booted to serve
SIZED = ["serve=vllm", "data.demo.num_train=96", "extract.samples_per_shard=4", "train.epochs=8",
         "train.checkpoint_every=5", "mlflow.run_name=stopped"]
# each stage, and what shows it is under way: a shard written, a checkpoint, its start
UNDER_WAY = [("extract", "extract/shard-train-*.json"), ("train", "train/checkpoints/step-*"),
             ("evaluate", "evaluate/_STARTED.json"), ("serve", "serve/_STARTED.json")]


def _stop_mid_stage(argv: list[str], run_dir: Path, log: Path, stage: str, under_way) -> float:
    """Start the pipeline, send SIGTERM once `under_way()` holds while `stage` is unfinished;
    the seconds from the signal to the exit (asserted 143, with the one eyas: line)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not under_way():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        took = time.monotonic() - sent
    text = log.read_text()
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "eyas: stopped by SIGTERM" in text, text[-3000:]
    # stopped inside the stage: had it finished first, nothing here was tested
    assert not (run_dir / stage / "_COMPLETE.json").exists(), f"{stage} finished before SIGTERM"
    return took


def _titled(prefix: str) -> list:
    """Processes whose command line (a Ray worker's title) starts with `prefix`."""
    import psutil
    return [p for p in psutil.process_iter(["cmdline"])
            if " ".join(p.info["cmdline"] or []).startswith(prefix)]


def _finished(run_dir: Path) -> dict[str, dict[str, str]]:
    return {p.parent.name: _digests(p.parent) for p in run_dir.glob("*/_COMPLETE.json")}


def test_sigterm_stops_each_long_stage_within_seconds_and_the_resume_redoes_nothing_finished(
        tmp_path, target_cache):
    """A scheduler's stop (SIGTERM) during extraction, training, evaluation and serving: each
    run stops within 30 s with the same line as Ctrl-C; the shards and checkpoints written
    before it are kept, and each resume skips what finished (the shards never rewritten,
    training resumed from its checkpoint) until the last run completes."""
    run_dir = tmp_path / "run"
    argv = _pipeline(run_dir, target_cache, "[prepare,extract,train,evaluate,serve]") + SIZED
    took, kept_shards, checkpoint = {}, None, None
    for stage, pattern in UNDER_WAY:
        before = _finished(run_dir)
        log = tmp_path / f"{stage}.log"
        took[stage] = _stop_mid_stage(argv, run_dir, log, stage,
                                      lambda: any(run_dir.glob(pattern)))
        for done, digests in before.items():  # finished before this run: untouched
            assert _digests(run_dir / done) == digests, done
        if stage == "extract":
            kept_shards = {p.name: (p.stat().st_mtime_ns, _digests(p.parent)[p.name])
                           for p in (run_dir / "extract").glob("shard-*") if p.is_file()}
            assert kept_shards
        if stage == "train":
            checkpoint = max(int(p.name.rsplit("-", 1)[1])
                             for p in (run_dir / "train" / "checkpoints").glob("step-*"))
    assert all(t < 30 for t in took.values()), took
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    for stage in ("prepare", "extract", "train", "evaluate"):
        assert f"{stage:<10} | skipped" in done.stdout, done.stdout[-3000:]
    shards = {p.name: (p.stat().st_mtime_ns, _digests(p.parent)[p.name])
              for p in (run_dir / "extract").glob("shard-*") if p.is_file()}
    assert {k: shards[k] for k in kept_shards} == kept_shards  # never written again
    report = json.loads((run_dir / "train" / "train_report.json").read_text())
    assert report["resumed_from"] >= checkpoint > 0


def test_sigterm_during_regeneration_stops_within_seconds_and_the_rerun_completes(
        tmp_path, target_cache):
    """SIGTERM while the target's vLLM replicas regenerate the answers: the run stops within
    30 s (the replicas with it), and the same command then regenerates and finishes."""
    run_dir = tmp_path / "run"
    argv = _pipeline(run_dir, target_cache, "[prepare]") + [
        "data.regenerate=true", "data.generation.temperature=1.0",
        "data.generation.max_new_tokens=24", "data.generation.on_truncated=keep",
        "data.demo.num_train=96"]
    log = tmp_path / "log.txt"
    took = _stop_mid_stage(argv, run_dir, log, "prepare",
                           lambda: "regenerate:" in log.read_text())
    assert took < 30, took
    deadline = time.monotonic() + 15  # the replicas went with the run's Ray
    while _titled("ray::GeneratorActor") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _titled("ray::GeneratorActor")
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((run_dir / "prepare" / "manifest.json").read_text())["regenerated"]


def test_sigterm_during_training_checkpoints_the_step_reached_and_the_resume_redoes_none(
        tmp_path, target_cache):
    """No periodic checkpoint falls inside this training (train.checkpoint_every past its last
    step): SIGTERM makes the workers checkpoint the step they reached (eyas/train/stop.py), the
    run says which and exits 143 within 30 s, and the same command resumes from that step."""
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    argv = _pipeline(run_dir, target_cache, "[prepare,extract,train]") + [
        "data.demo.num_train=96", "train.epochs=20", "train.checkpoint_every=100000"]

    def training():  # the workers logged a loss past step 10 (rank 0 logs every 5 steps)
        import sqlite3
        if not (run_dir / "train" / "_STARTED.json").exists():
            return False
        try:
            with sqlite3.connect(f"file:{run_dir / 'mlflow.db'}?mode=ro", uri=True) as db:
                return bool(db.execute("SELECT 1 FROM metrics WHERE key = 'loss' AND step >= 10"
                                       ).fetchone())
        except sqlite3.Error:  # the store busy: look again
            return False

    took = _stop_mid_stage(argv, run_dir, log, "train", training)
    assert took < 30, took
    steps = [int(p.name.rsplit("-", 1)[1])
             for p in (run_dir / "train" / "checkpoints").glob("step-*")]
    assert len(steps) == 1 and steps[0] > 0, steps  # the stop's, not a periodic one
    assert f"train: checkpointed step {steps[0]} as it stopped" in log.read_text()
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = json.loads((run_dir / "train" / "train_report.json").read_text())
    assert report["resumed_from"] == steps[0]
