"""A run stopped by SIGTERM (a scheduler's preemption, `kill`): one `eyas:` line and exit 143
instead of Ray's stack dump and an abort; what finished is untouched and the next run skips it."""
from __future__ import annotations

import hashlib
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
