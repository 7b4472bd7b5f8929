"""eyas's DFlash and P-EAGLE against speculators' own trainers over full runs
(bench/peer_dflash.py, bench/peer_peagle.py: one record shape), for docs/scripts/tables.py."""
from __future__ import annotations


def _acc(values) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


def peer_dflash_table(record: dict, table) -> str:
    """One row per trainer and seed, then each trainer's mean with its range over the seeds,
    and the verdict: eyas's mean predicted τ within speculators' range or not."""
    out = record["rows"]
    rows = [[r["trainer"], r["seed"], r["steps"], f"{r['tokens_per_s']:.0f}",
             f"{r['final_loss']:.3f}", _acc(r["in_vocab"]), f"{r['predicted_tau']:.3f}"]
            for r in out["rows"]]
    for name, s in out["summary"].items():
        tau, low, high = s["predicted_tau"]
        rows.append([f"**{name}**, mean (range)", "", "", "", "",
                     " / ".join(f"{m:.3f} ({lo:.3f}–{hi:.3f})" for m, lo, hi in s["in_vocab"]),
                     f"**{tau:.3f}** ({low:.3f}–{high:.3f})"])
    verdict = ("within" if out["within_spread"] else "**outside**")
    return table(["trainer", "seed", "steps", "training tokens/s", "last step's loss",
                  "held-out accuracy per position", "predicted τ"], rows) + (
        f"\n\neyas's mean predicted τ is {verdict} speculators' range over its seeds.")
