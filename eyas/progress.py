"""Progress bars for long work that stay readable in a log: on a terminal a bar redraws in
place; elsewhere (a Ray worker, `ray job submit`, CI) every redraw becomes a line of the log,
so it redraws at most every `LOG_INTERVAL_S` seconds (the demo's target build printed 601 lines
before, one per step)."""
from __future__ import annotations

import sys

from tqdm.auto import tqdm

LOG_INTERVAL_S = 10.0


def progress(iterable=None, **kwargs) -> tqdm:
    """tqdm with a log-friendly refresh rate when stderr is not a terminal."""
    if not _is_terminal():
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
        kwargs.setdefault("maxinterval", max(LOG_INTERVAL_S, kwargs["mininterval"]))
    return tqdm(iterable, **kwargs)


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
