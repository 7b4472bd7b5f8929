"""The tables of a docs command timed as a user runs it (bench/first_command_bench.py): the
README's pipeline command (`first`), the demo's served sets (`demo`) and variants of one command
(`runs`), for docs/scripts/tables.py, which hands each its table writer."""
from __future__ import annotations

from cells import per as _per, pm as _pm, ratio as _ratio

STAGES = ("prepare", "extract", "train", "evaluate", "serve")


def first_table(record: dict, table) -> str:
    """The README's pipeline command timed: minutes per stage, served τ and the interleaved
    concurrency-1 ratio with their intervals, lossless and parity."""
    rows = []
    for r in record["rows"]:
        env = ", ".join(f"{k}={v}" for k, v in r["env"].items()) or "this CPU as it is"
        stages = " / ".join(f"{r['stage_minutes'].get(s, 0):.1f}" for s in STAGES)
        low, high = r.get("tau_interval") or (r.get("tau"), r.get("tau"))
        rows.append([env, r["rc"], f"{r['minutes']:.1f} min", stages,
                     _pm(r["tau"], low, high) if r.get("tau") else "–",
                     _ratio(r) if r.get("ratio_interval") else "–", r.get("lossless"),
                     r.get("parity")])
    return table(["machine", "exit", "in all", "prepare / extract / train / evaluate / serve "
                  "(min)", "held-out τ (95 %)", "ratio, interleaved (95 %)", "lossless",
                  "parity"], rows)


def demo_table(record: dict, table) -> str:
    """One row per served set of the one run: requests and drafts, served τ with its interval
    beside the evaluate stage's offline τ of the same requests, acceptance per position, time
    per token with and without the draft at concurrency 1 (mean and p99), the ratio at each
    concurrency with its interval, and lossless (judged at near-ties by the serve stage)."""
    run = record["rows"][0]
    levels = [lv["concurrency"] for lv in next(iter(run["sets"].values()))["levels"]]
    rows = []
    for name, s in run["sets"].items():
        one = s["levels"][0]
        rows.append([name, one["requests"], s["drafts"], _pm(s["tau"], *s["tau_interval"]),
                     f"{s['offline_tau']:.3f}" if s.get("offline_tau") is not None else "–",
                     _per(s["per_position"], len(s["per_position"])),
                     f"{one['tpot_ms']:.2f} / {one['tpot_ms_plain']:.2f}",
                     f"{one['p99_tpot_ms']:.2f} / {one['p99_tpot_ms_plain']:.2f}",
                     *[_ratio(lv) if lv.get("ratio_interval") else f"{lv['ratio']:.2f}"
                       for lv in s["levels"]],
                     "yes" if all(lv["lossless"] for lv in s["levels"]) else "**no**"])
    return table(["set", "requests", "drafts", "served τ (95 %)", "offline τ",
                  "accepted per position", f"ms per token with / without, c={levels[0]}",
                  f"p99 ms per token with / without, c={levels[0]}",
                  *[f"ratio c={c} (95 %)" for c in levels],
                  "lossless (partings judged at near-ties)"], rows)


def runs_table(record: dict, table) -> str:
    """Variants of one docs command (`--vary`), a row each: what was added to the command,
    minutes in all, the held-out split's served τ with its interval beside the evaluate stage's
    offline τ, acceptance per position, time per token with and without the draft at
    concurrency 1, the ratio at each concurrency with its interval, and lossless."""
    base = min((r["arguments"] for r in record["rows"]), key=len)
    rows, levels = [], None
    for r in record["rows"]:
        s = r["sets"]["heldout"]
        levels = levels or [lv["concurrency"] for lv in s["levels"]]
        one = s["levels"][0]
        added = " ".join(f"`{a}`" for a in r["arguments"][len(base):]) or "the command as given"
        rows.append([added, f"{r['minutes']:.1f} min", _pm(s["tau"], *s["tau_interval"]),
                     f"{s['offline_tau']:.3f}" if s.get("offline_tau") is not None else "–",
                     _per(s["per_position"], len(s["per_position"])),
                     f"{one['tpot_ms']:.2f} / {one['tpot_ms_plain']:.2f}",
                     *[_ratio(lv) if lv.get("ratio_interval") else f"{lv['ratio']:.2f}"
                       for lv in s["levels"]],
                     "yes" if all(lv["lossless"] for lv in s["levels"]) else "**no**"])
    return table(["run", "in all", "held-out τ (95 %)", "offline τ", "accepted per position",
                  f"ms per token with / without, c={levels[0]}",
                  *[f"ratio c={c} (95 %)" for c in levels],
                  "lossless (partings judged at near-ties)"], rows)
