"""How the docs' generated tables write a figure in a cell (docs/scripts/tables.py and the table
modules beside it)."""
from __future__ import annotations


def pm(tau, low, high) -> str:
    """τ with the half-width of its interval."""
    return f"{tau:.3f} ± {(high - low) / 2:.3f}"


def per(values, n=4) -> str:
    """The first n figures of a per-position list."""
    shown = " / ".join(f"{v:.2f}" for v in values[:n])
    return shown + (" / …" if len(values) > n else "")


def ratio(v: dict) -> str:
    """A ratio with its interval (`ratio`, `ratio_interval`)."""
    low, high = v["ratio_interval"]
    return f"{v['ratio']:.2f} ({low:.2f}–{high:.2f})"
