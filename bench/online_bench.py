"""Online training against extract-then-train, one run, same data and budget (issue: online).

    python bench/online_bench.py [OUT_DIR] [--modes offline,online] [--json PATH] [key=value ...]

For each mode (offline; online; online with train.online.keep_epoch) it runs the pipeline's
prepare stage (untimed), then extract + train (timed), and prints side by side: wall time of
extract + train, training tokens/s, bytes written under run_dir/extract, the peak of Ray's
object store (plasma), sampled every 0.2 s, and the draft's held-out accuracy per position
(the same draft quality is the point). Overrides go to every mode (default: the demo
without regeneration: the bench is about the states' path, not the data; target=smollm2 for
the real model). --json writes the table and its record (bench/record.py).
"""
from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # record

MODES = {"offline": ["train.source=offline"],
         "online": ["train.source=online"],
         "online, keep_epoch": ["train.source=online", "train.online.keep_epoch=true"]}


class PlasmaPeak:
    """The largest object-store use seen while running (Ray's own stats, every 0.2 s)."""

    def __init__(self):
        self.peak, self.stop = 0.0, threading.Event()

    def __enter__(self):
        from ray._private.internal_api import memory_summary

        def poll():
            while not self.stop.wait(0.2):
                used = re.search(r"Plasma memory usage (\d+) MiB", memory_summary(stats_only=True))
                if used:
                    self.peak = max(self.peak, float(used.group(1)))
        self.thread = threading.Thread(target=poll, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()
               and not p.name.startswith((".", "_")))


def main(argv: list[str]) -> None:
    import argparse

    import ray

    from workflows.config import load_config
    from workflows.pipeline import run

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="/tmp/eyas-online-bench")
    p.add_argument("--modes", default=",".join(MODES), help=f"of {list(MODES)}")
    p.add_argument("--json", type=Path)
    a, overrides = p.parse_known_args(argv)
    out, modes = a.out, [m.strip() for m in a.modes.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown or modes[0] != "offline":
        raise SystemExit(f"--modes {a.modes}: start with offline, then any of {list(MODES)[1:]}")
    ray.init(object_store_memory=2 * 1024**3, include_dashboard=False, log_to_driver=False)
    rows = []
    for name, mode in ((m, MODES[m]) for m in modes):
        run_dir = Path(out) / name.replace(", ", "-")
        base = [f"run_dir={run_dir}", "data.regenerate=false", f"mlflow.run_name={name}",
                *mode, *overrides]
        run(load_config(["stages=[prepare]", *base]))
        with PlasmaPeak() as plasma:
            started = time.perf_counter()
            run(load_config(["stages=[extract,train]", *base]))
            seconds = time.perf_counter() - started
        report = json.loads((RunDir.of(run_dir).stage("train") / "train_report.json").read_text())
        stream = RunDir.of(run_dir).stage("train") / "stream.json"
        rows.append({"mode": name, "seconds": seconds, "train_tokens_per_s": report["tokens_per_s"],
                     "extract_bytes": _bytes(RunDir.of(run_dir).extract), "peak_plasma_mib": plasma.peak,
                     "heldout_accuracy": report.get("heldout_accuracy"),
                     "stream": json.loads(stream.read_text()) if stream.exists() else {},
                     "run_dir": str(run_dir)})
    ray.shutdown()
    offline = rows[0]
    print(f"\n{'mode':<20} {'extract+train s':>16} {'vs offline':>10} {'train tok/s':>12} "
          f"{'extract bytes':>14} {'peak plasma MiB':>16} {'held-out acc':<24} stream")
    for r in rows:
        stream = r["stream"]
        info = (f"{stream['computed_steps']} computed, {stream['reused_steps']} reused"
                if stream else "")
        acc = " / ".join(f"{x:.3f}" for x in (r["heldout_accuracy"] or [])[:3])
        print(f"{r['mode']:<20} {r['seconds']:>16.1f} {r['seconds'] / offline['seconds']:>10.2f} "
              f"{r['train_tokens_per_s']:>12.0f} {r['extract_bytes']:>14,} "
              f"{r['peak_plasma_mib']:>16.0f} {acc:<24} {info}")
    if len(rows) > 1:
        print(f"\nbytes written under extract, online / offline = "
              f"{rows[1]['extract_bytes'] / offline['extract_bytes']:.4f}")
    if a.json:
        from record import provenance, write
        write(a.json, rows, provenance(argv),
              {r["mode"]: {"overrides": overrides, "mode": MODES[r["mode"]]} for r in rows},
              compared=("mode",), shared=("overrides",))


if __name__ == "__main__":
    main(sys.argv[1:])
