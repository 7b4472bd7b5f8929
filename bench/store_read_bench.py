"""Reading a store at random, as a training epoch does, from the disk: the bytes the disk
delivers and the time, with eyas's read advice (eyas/store/format.py: MADV_RANDOM on each
mapping, MADV_WILLNEED on each sample's rows) and without it (the kernel's read-around on each
page fault), alternated in rounds on the same samples.

Before each side's round every file of the store is dropped from the page cache
(posix_fadvise DONTNEED; pages another process maps stay), so both read from the disk.

    python bench/store_read_bench.py RUN_DIR/extract --samples 2000 --rounds 3 --json PATH
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT / "bench"))
sys.path.insert(0, str(CHECKOUT))

SIDES = ("advised", "read-around")


def drop_cache(store: Path) -> None:
    for f in store.iterdir():
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def disk_bytes() -> int:
    """Bytes this process caused to be fetched from storage (/proc/self/io read_bytes)."""
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes")


def read_side(store: Path, indices: list[int], side: str, batch: int = 16) -> dict:
    """Open the store afresh and read `indices` in batches, every slot's rows copied out, as
    eyas.train.data's producer does; without the advice for side "read-around"."""
    import eyas.store.format as fmt
    from eyas.store.reader import ExtractedDataset

    saved = fmt._MADVISE
    fmt._MADVISE = saved if side == "advised" else None
    try:
        drop_cache(store)
        ds = ExtractedDataset(store)
        used, before, t0 = 0, disk_bytes(), time.perf_counter()
        for b in range(0, len(indices), batch):
            samples = [ds[i] for i in indices[b:b + batch]]  # views: every sample's advice first
            for s in samples:
                for rows in s.slots.values():
                    used += rows.clone().nbytes
        seconds = time.perf_counter() - t0
        return {"side": side, "seconds": seconds, "disk_bytes": disk_bytes() - before,
                "used_bytes": used}
    finally:
        fmt._MADVISE = saved


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", type=Path, help="an extraction directory (run_dir/extract)")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the record here")
    a = p.parse_args(argv)
    from eyas.store.reader import ExtractedDataset

    n = len(ExtractedDataset(a.store))
    indices = random.Random(a.seed).sample(range(n), min(a.samples, n))
    rounds = []
    for r in range(a.rounds):
        order = SIDES if r % 2 == 0 else SIDES[::-1]  # alternated: the machine's drift cancels
        rounds.append({side: read_side(a.store, indices, side) for side in order})
        x = rounds[-1]
        print(f"round {r + 1}: " + "; ".join(
            f"{s} {x[s]['seconds']:.1f} s, disk {x[s]['disk_bytes'] / 2**20:,.0f} MiB for "
            f"{x[s]['used_bytes'] / 2**20:,.0f} MiB used" for s in SIDES), flush=True)
    rows = []
    for side in SIDES:
        seconds = [x[side]["seconds"] for x in rounds]
        amp = [x[side]["disk_bytes"] / x[side]["used_bytes"] for x in rounds]
        rows.append({"side": side, "samples": len(indices), "store_samples": n,
                     "rounds": [x[side] for x in rounds], "seconds": statistics.median(seconds),
                     "seconds_interval": [min(seconds), max(seconds)],
                     "disk_per_used": statistics.median(amp),
                     "disk_per_used_interval": [min(amp), max(amp)]})
    speed = [x["read-around"]["seconds"] / x["advised"]["seconds"] for x in rounds]
    summary = {"read_around_over_advised_seconds": statistics.median(speed),
               "interval": [min(speed), max(speed)]}
    print(f"read-around takes {summary['read_around_over_advised_seconds']:.2f}x the advised "
          f"side's time ({min(speed):.2f}-{max(speed):.2f}); disk bytes per used byte: "
          + ", ".join(f"{r['side']} {r['disk_per_used']:.2f}" for r in rows))
    if a.json:
        from record import provenance, write
        for row in rows:
            row.update(summary)
        write(a.json, rows, provenance(argv),
              {side: {"side": side, "samples": len(indices), "seed": a.seed,
                      "store": str(a.store)} for side in SIDES},
              compared=("side",), shared=("samples", "seed", "store"))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
