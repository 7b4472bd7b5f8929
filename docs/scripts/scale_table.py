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


def resume_table(record: dict, table) -> str:
    """The size run stopped and resumed (bench/scale_bench.py --resume-size): per attempt,
    its seconds, what it read beside the store it found, and the finished files it rewrote."""
    row = next(r for r in record["rows"] if "resumed" in r)
    resumed = row["resumed"]
    out = []
    for at in resumed["attempts"]:
        checkpoints = ", ".join(str(c) for c in at["checkpoints_before"]) or "none"
        out.append([at["attempt"], f"{at['exit']}", f"{at['seconds']:.0f}",
                    f"{at['finished_files_before']:,} ({at['train_shards_before']} train shards)",
                    f"{at['finished_files_rewritten']}", checkpoints,
                    f"{at['store_bytes_before'] / MIB:,.0f}", f"{at['bytes_read'] / MIB:,.0f}"])
    head = [f"{row['conversations']:,} conversations, one run directory (training resumed from "
            f"step {resumed['train_resumed_from']}; a checkpoint every "
            f"{resumed['checkpoint_every']} steps)", "exit", "seconds",
            "finished prepare and extract files before it", "of them rewritten",
            "training checkpoints before it", "store before it (MiB)",
            "read by every process (MiB)"]
    return table(head, out)


def store_read_table(record: dict, table) -> str:
    """bench/store_read_bench.py: the same random samples read from the disk with eyas's read
    advice and without, per side its seconds and the disk's bytes per byte used."""
    out = []
    for row in record["rows"]:
        lo, hi = row["seconds_interval"]
        alo, ahi = row["disk_per_used_interval"]
        used = row["rounds"][0]["used_bytes"] / MIB
        out.append([row["side"], f"{row['seconds']:.1f} ({lo:.1f}–{hi:.1f})",
                    f"{row['rounds'][0]['disk_bytes'] / MIB:,.0f} for {used:,.0f}",
                    f"{row['disk_per_used']:.2f} ({alo:.2f}–{ahi:.2f})"])
    first = record["rows"][0]
    head = [f"{first['samples']:,} random samples of {first['store_samples']:,}, "
            f"{len(first['rounds'])} rounds alternated, page cache dropped before each",
            "seconds, median (min–max)", "MiB from the disk for MiB of rows (round 1)",
            "disk bytes per byte used"]
    return table(head, out)
