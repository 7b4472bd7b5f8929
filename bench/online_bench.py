"""Online training against extract-then-train, one run, same data and budget (issue: online).

    python bench/online_bench.py [OUT_DIR] [key=value ...]

For each mode (offline; online; online with train.online.keep_epoch) it runs the pipeline's
prepare stage (untimed), then extract + train (timed), and prints side by side: wall time of
extract + train, training tokens/s, bytes written under run_dir/extract, and the peak of Ray's
object store (plasma), sampled every 0.2 s. Overrides go to every mode (default: the demo
without regeneration: the bench is about the states' path, not the data).
"""
from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def main(out: str = "/tmp/eyas-online-bench", *overrides: str) -> None:
    import ray

    from workflows.config import load_config
    from workflows.pipeline import run

    ray.init(object_store_memory=2 * 1024**3, include_dashboard=False, log_to_driver=False)
    rows = []
    for name, mode in MODES.items():
        run_dir = Path(out) / name.replace(", ", "-")
        base = [f"run_dir={run_dir}", "data.regenerate=false", f"mlflow.run_name={name}",
                *mode, *overrides]
        run(load_config(["stages=[prepare]", *base]))
        with PlasmaPeak() as plasma:
            started = time.perf_counter()
            run(load_config(["stages=[extract,train]", *base]))
            seconds = time.perf_counter() - started
        report = json.loads((run_dir / "train" / "train_report.json").read_text())
        stream = run_dir / "train" / "stream.json"
        rows.append((name, seconds, report["tokens_per_s"], _bytes(run_dir / "extract"),
                     plasma.peak, json.loads(stream.read_text()) if stream.exists() else {}))
    ray.shutdown()
    offline = rows[0]
    print(f"\n{'mode':<20} {'extract+train s':>16} {'vs offline':>10} {'train tok/s':>12} "
          f"{'extract bytes':>14} {'peak plasma MiB':>16}  stream")
    for name, seconds, tps, written, peak, stream in rows:
        info = (f"{stream['computed_steps']} computed, {stream['reused_steps']} reused"
                if stream else "")
        print(f"{name:<20} {seconds:>16.1f} {seconds / offline[1]:>10.2f} {tps:>12.0f} "
              f"{written:>14,} {peak:>16.0f}  {info}")
    print(f"\nbytes written under extract, online / offline = {rows[1][3] / offline[3]:.4f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
