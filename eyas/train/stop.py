"""A stop asked of a training run from outside it: the pipeline's driver, at SIGTERM (a
scheduler's preemption) or Ctrl-C, writes a request into the train stage's folder; the training
loop sees it at its next step, every rank at the same step (the request is counted in the
step's all-reduce), checkpoints the step it finished and returns; rank 0 then acknowledges with
the step, which the driver waits for (a bounded time) before it lets the run stop. So a resumed
run redoes no finished step, not only those after the last periodic checkpoint.

    out_dir/_STOP_REQUESTED   written by the driver (one writer: the run's), removed when a
                              training starts
    out_dir/_STOPPED.json     {"step": N, "checkpoint": PATH}, written by rank 0
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

REQUEST = "_STOP_REQUESTED"
STOPPED = "_STOPPED.json"
# how long a stopped run waits for the workers to checkpoint the step they are on: inside the
# 30 s a Kubernetes pod or a Slurm job is given between SIGTERM and SIGKILL by default
GRACE_S = 25.0


def interrupt_in(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt (the driver's stop, Ctrl-C) behind `exc`: raised inside Ray's
    wait, a stop arrives wrapped ("SystemError: ... returned a result with an exception set")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def clear(out_dir: str | Path) -> None:
    """A training starts: no request or acknowledgement of an earlier run stands."""
    for name in (REQUEST, STOPPED):
        try:
            os.unlink(Path(out_dir) / name)
        except FileNotFoundError:
            pass


def request(out_dir: str | Path) -> None:
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / REQUEST).write_text(time.strftime("%Y-%m-%d %H:%M:%S") + "\n")


def requested(out_dir: str | Path) -> bool:
    return (Path(out_dir) / REQUEST).exists()


def acknowledge(out_dir: str | Path, step: int, checkpoint: Path) -> None:
    tmp = Path(out_dir) / (STOPPED + ".tmp")
    tmp.write_text(json.dumps({"step": step, "checkpoint": str(checkpoint)}))
    os.replace(tmp, Path(out_dir) / STOPPED)


def wait(out_dir: str | Path, timeout_s: float, poll_s: float = 0.1) -> dict | None:
    """The acknowledgement ({"step", "checkpoint"}) once written, None after `timeout_s`."""
    path, deadline = Path(out_dir) / STOPPED, time.monotonic() + timeout_s
    while True:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)
