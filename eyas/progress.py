"""What a person sees of long work: progress bars that stay readable in a log, and the
engines' own logs kept out of the way.

On a terminal a bar redraws in place; elsewhere (a Ray worker, `ray job submit`, CI) every
redraw becomes a line of the log, so it redraws at most every `LOG_INTERVAL_S` seconds (the
demo's target build printed 601 lines before, one per step).

vLLM's and Ray's own INFO logs (weight loading, KV cache sizes, throughput every 10 s, worker
groups starting) are off unless a run asks for them with `--debug`, which the entry points
pass on to every worker as EYAS_DEBUG=1 (`verbose()`): vLLM is quieted where eyas imports it
(eyas/engines/vllm_engine.py), Ray where the pipeline starts it, with `QUIET_ENV` for the
workers of a local Ray.
"""
from __future__ import annotations

import os
import sys

from tqdm.auto import tqdm

LOG_INTERVAL_S = 10.0
DEBUG_ENV = "EYAS_DEBUG"
# read when a worker's torch loads: torch's C++ warnings (vLLM's CPU worker: "NUMA binding:
# Using MEMBIND policy") and transformers' bar for a weight load that takes a second
QUIET_ENV = {"TORCH_CPP_LOG_LEVEL": "ERROR", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def progress(iterable=None, **kwargs) -> tqdm:
    """tqdm with a log-friendly refresh rate when stderr is not a terminal."""
    if not _is_terminal():
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
        kwargs.setdefault("maxinterval", max(LOG_INTERVAL_S, kwargs["mininterval"]))
    return tqdm(iterable, **kwargs)


def verbose() -> bool:
    """Whether this run asked for the engines' own logs and eyas's tracebacks (--debug)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
