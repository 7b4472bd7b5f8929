"""A Ray Train worker killed mid-training (kill -9: a lost node, the OOM killer) with two
workers: the worker group is restarted and resumes from the newest checkpoint, and the run
finishes; it neither fails nor starts training over."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _train_workers(driver: int) -> list[psutil.Process]:
    """This run's Ray Train workers: descendants of its driver (its own local Ray)."""
    return [p for p in psutil.Process(driver).children(recursive=True)
            if "RayTrainWorker" in " ".join(p.cmdline())]


def test_a_killed_train_worker_restarts_from_the_checkpoint(tmp_path, target_cache):
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    checkpoints = run_dir / "train" / "checkpoints"
    cmd = [sys.executable, "-m", "workflows.pipeline", "experiment=tiny", f"run_dir={run_dir}",
           "stages=[prepare,extract,train]", f"target.builtin.cache_dir={target_cache}",
           "train.num_workers=2", "train.epochs=60", "train.checkpoint_every=20",
           "debug=true"]  # Ray Train's own log says the group was restarted
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 400
        while not (checkpoints / "step-0000020").exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        victim = _train_workers(proc.pid)[-1]
        victim.kill()
        victim.wait(10)
        code = proc.wait(timeout=600)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "Error count: 1 (max allowed: 2)" in text  # the group was restarted once
    report = json.loads((run_dir / "train" / "train_report.json").read_text())
    assert report["steps"] == 360
    assert report["resumed_from"] >= 20  # from a checkpoint, not from step 0
    assert (run_dir / "train" / "draft" / "model.safetensors").is_file()
