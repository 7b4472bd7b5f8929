"""Figures logged to MLflow (matplotlib, headless)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def norm_fingerprints(norms: dict[str, list[float]], title: str):
    """Mean ± std of per-token L2 norms per slot: a missing or shifted slot stands out."""
    names = list(norms)
    means = [norms[n][0] for n in names]
    stds = [norms[n][1] for n in names]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(names)), 3.2))
    ax.bar(names, means, yerr=stds, color="#4a7bb7", capsize=4)
    ax.set_yscale("log")
    ax.set_ylabel("per-token L2 norm")
    ax.set_title(title, fontsize=10)
    for i, m in enumerate(means):
        ax.text(i, m, f"{m:.3g}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    return fig


def per_position_bars(series: dict[str, list[float]], title: str):
    """Grouped bars per draft position (accuracy or acceptance), one colour per series."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    width = 0.8 / max(1, len(series))
    for j, (name, values) in enumerate(series.items()):
        xs = [i + j * width for i in range(len(values))]
        ax.bar(xs, values, width=width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(max(len(v) for v in series.values()))])
    ax.set_xticklabels([str(i + 1) for i in range(max(len(v) for v in series.values()))])
    ax.set_xlabel("draft position")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def concurrency_sweep(sweep: list[dict]):
    """Time per output token with and without the draft, and their ratio, per concurrency."""
    levels = [p["concurrency"] for p in sweep]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, 3.2))
    ax.plot(levels, [p["time_per_token_ms_plain"] for p in sweep], "o-", label="target alone")
    ax.plot(levels, [p["time_per_token_ms_spec"] for p in sweep], "o-", label="with the draft")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("ms per output token")
    ax.legend(fontsize=8)
    bx.plot(levels, [p["ratio"] for p in sweep], "o-", color="#b74a4a")
    bx.axhline(1.0, color="grey", lw=0.8, ls="--")
    bx.set_xscale("log", base=2)
    bx.set_xlabel("requests in flight")
    bx.set_ylabel("speculative / plain time per token")
    for p in sweep:
        bx.text(p["concurrency"], p["ratio"], f"tau {p['tau']:.2f}", fontsize=7,
                ha="center", va="bottom")
    fig.suptitle("latency with and without the draft", fontsize=10)
    fig.tight_layout()
    return fig


def tau_per_set(sets):
    """Served tau per prompt set with its 95 % interval (eyas.serve.report.SetResult)."""
    names = [r.name for r in sets]
    taus = [r.sweep[0].tau for r in sets]
    lows = [t - r.acceptance["tau_interval"][0] for t, r in zip(taus, sets)]
    highs = [r.acceptance["tau_interval"][1] - t for t, r in zip(taus, sets)]
    fig, ax = plt.subplots(figsize=(max(4, 1.3 * len(names)), 3.2))
    ax.bar(names, taus, yerr=[lows, highs], color="#4a7bb7", capsize=4)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("served tau (tokens per verify step)")
    ax.set_title("acceptance length per prompt set, concurrency 1 (95 % interval)",
                 fontsize=10)
    for i, t in enumerate(taus):
        ax.text(i, t, f"{t:.2f}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    return fig
