"""The cost-against-size table (bench/scale_bench.py), for docs/scripts/tables.py."""
from __future__ import annotations

STAGES = ("prepare", "extract", "train", "evaluate")
MIB = 2 ** 20


def _sizes(rows) -> str:
    return " / ".join(f"{r['conversations']:,}" for r in rows)


def _ratio(last, first) -> str:
    return f"{last / first:.2f}x" if first else "–"


def _ratios(values) -> str:
    """The largest size's over each smaller one's: over the smallest / over the next ..."""
    return " / ".join(_ratio(values[-1], v) for v in values[:-1])


def scale_table(record: dict, table) -> str:
    """Per stage: seconds per 1k training tokens and its worker's peak memory at each size,
    and the largest size's over the smallest's; then the driver, the store, a rerun."""
    rows = record["rows"]
    last = rows[-1]
    out = []
    for stage in STAGES:
        per = [r["stages"][stage]["s_per_1k_tokens"] for r in rows]
        mem = [(r["stages"][stage]["worker_peak_anon"] or 0) / MIB for r in rows]
        read = [r["stages"][stage]["bytes_read"] / MIB for r in rows]
        out.append([stage, " / ".join(f"{p:.4f}" for p in per), _ratios(per),
                    " / ".join(f"{m:.0f}" for m in mem), _ratios(mem),
                    " / ".join(f"{b:,.0f}" for b in read)])
    driver = [max(s["driver_peak_anon"] or 0 for s in r["stages"].values()) / MIB for r in rows]
    out.append(["the driver (`eyas run`)", "", "", " / ".join(f"{m:.0f}" for m in driver),
                _ratios(driver), ""])
    rerun = [r["rerun"] for r in rows]
    out.append(["the same command again, every stage finished",
                " / ".join(f"{x['seconds']:.1f} s" for x in rerun),
                _ratios([x["seconds"] for x in rerun]), "", "",
                " / ".join(f"{x['bytes_read'] / MIB:,.0f}" for x in rerun)])
    tokens = " / ".join(f"{r['splits']['train']['tokens'] / 1e6:.2f}M" for r in rows)
    store = " / ".join(f"{r['store_bytes'] / 2**30:.1f}" for r in rows)
    over = f"{last['conversations']:,} over " + " / ".join(
        f"{r['conversations']:,}" for r in rows[:-1])
    head = [f"{_sizes(rows)} conversations ({tokens} tokens; store {store} GiB)",
            "seconds per 1k tokens", over, "its worker's peak memory (MiB)", over,
            "read by every process (MiB)"]
    return table(head, out)
