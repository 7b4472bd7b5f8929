"""What the evaluate stage writes: run_dir/evaluate/report.json and its figures.

    {"per_position_accuracy": {"train": {full, in_vocab, conditional, ...},
                               "heldout": {...}},
     "predicted_tau": {"train": 2.9, "heldout": 2.6},  # from heldout's conditional accuracy
     "measured_tau": 2.5, "measured": {counters of real speculative decoding},
     "reported_train_accuracy": [...],                  # what training measured while it
     "reported_train_accuracy_source": "measured ...",  # trained, when known, and from where
     "doctor": {ok, findings, best_layout, table, ...}}

Figures are matplotlib, imported only when asked for (Agg: no display needed).
"""
from __future__ import annotations

from eyas.evaluate.doctor import Verdict
from eyas.evaluate.gap import as_list
from eyas.draft.accuracy import StepAccuracy
from eyas.acceptance import AcceptanceStats


def report_dict(train: StepAccuracy, heldout: StepAccuracy, verdict: Verdict,
                measured: AcceptanceStats | None = None, reported=None) -> dict:
    return {
        "per_position_accuracy": {"train": train.to_dict(), "heldout": heldout.to_dict()},
        "predicted_tau": {"train": train.predicted_tau, "heldout": heldout.predicted_tau},
        "measured_tau": measured.tau if measured else None,
        "measured": measured.to_dict() if measured else None,
        "reported_train_accuracy": as_list(reported) if reported is not None else None,
        "reported_train_accuracy_source": (getattr(reported, "source", "given")
                                           if reported is not None else None),
        "doctor": verdict.to_dict(),
    }


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def accuracy_figure(train: StepAccuracy, heldout: StepAccuracy,
                    measured: AcceptanceStats | None = None):
    """Bars: full accuracy per draft position, train vs held-out; conditional as markers, and
    the measured per-position acceptance rate (engine-style) when given."""
    plt = _pyplot()
    positions = range(1, len(train.full) + 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(train.full) + 2), 3.2))
    width = 0.38
    ax.bar([p - width / 2 for p in positions], train.full, width, label="train (full)",
           color="#4a7bb7")
    ax.bar([p + width / 2 for p in positions], heldout.full, width, label="held-out (full)",
           color="#e0a040")
    ax.plot(list(positions), heldout.conditional, "k^", label="held-out conditional")
    if measured is not None:
        ax.plot(range(1, len(measured.per_position_rate) + 1), measured.per_position_rate, "rs",
                label="measured acceptance")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(list(positions))
    ax.set_title(f"predicted tau: train {train.predicted_tau:.2f}, held-out "
                 f"{heldout.predicted_tau:.2f}"
                 + (f", measured {measured.tau:.2f}" if measured else ""), fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def norms_figure(verdict: Verdict):
    """Norm fingerprint of every probe slot (log scale), the draft's slots highlighted, and
    the norms of handed-in features where the doctor was given some."""
    plt = _pyplot()
    names = list(verdict.probe_norms)
    used = set(verdict.recorded.names)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(names) + 2), 3.2))
    ax.bar(names, [verdict.probe_norms[n].mean for n in names],
           yerr=[verdict.probe_norms[n].std for n in names], capsize=3,
           color=["#4a7bb7" if n in used else "#b0b0b0" for n in names],
           label="stored (blue: the draft's slots)")
    for m in verdict.feature_matches:
        ax.plot([m.best], [m.norms.mean], "rv", markersize=9)
        ax.annotate(f"fed {m.position}", (names.index(m.best), m.norms.mean), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_ylabel("per-token L2 norm")
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax.set_title("norm fingerprints per slot" + (" (red: fed features)"
                                                 if verdict.feature_matches else ""),
                 fontsize=10)
    fig.tight_layout()
    return fig
