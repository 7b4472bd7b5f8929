"""Training speed against the peer trainer's, side by side in one run: eyas's training loop and
speculators' own model code and loss (bench/peer_recipe.py) on the same first STEPS batches
of a run's extraction, with the run's settings (precision included), alternated twice so that
a drift of the machine falls on both:

    eyas bench peer-speed RUN_DIR [--steps 16] [--json PATH]

Prints training tokens/s of each round and the ratio eyas / speculators over the rounds
(issue goal: at least 1.3). Nothing of RUN_DIR is written: the drafts go to a temporary
directory.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    import torch

    from eyas.train.loop import train_draft
    from peer_recipe import train_speculators
    from recipe_bench import run_settings

    run = a.run_dir.resolve()
    train, draft, target, _ = run_settings(run)
    rows = []
    with tempfile.TemporaryDirectory(prefix="eyas-peer-speed-") as tmp:
        for i in range(a.rounds):
            torch.set_num_threads(2)
            ours = train_draft(str(RunDir.of(run).extract), target, f"{tmp}/eyas{i}", train, draft,
                               stop_after=a.steps).tokens_per_s
            _, theirs = train_speculators(RunDir.of(run).extract, target, Path(f"{tmp}/spec{i}"),
                                          train, draft, stop_after=a.steps)
            rows.append({"round": i, "eyas_tokens_per_s": ours,
                         "speculators_tokens_per_s": theirs})
            print(f"round {i}: eyas {ours:.0f} tokens/s, speculators {theirs:.0f} tokens/s",
                  flush=True)
    eyas = sum(r["eyas_tokens_per_s"] for r in rows) / len(rows)
    spec = sum(r["speculators_tokens_per_s"] for r in rows) / len(rows)
    print(f"\n{a.steps} steps x {a.rounds} rounds on {run / 'extract'} (precision "
          f"{train.precision}): eyas {eyas:.0f}, speculators {spec:.0f} tokens/s, "
          f"ratio {eyas / spec:.2f}")
    out = {"steps": a.steps, "rows": rows, "eyas_tokens_per_s": eyas,
           "speculators_tokens_per_s": spec, "ratio": eyas / spec}
    if a.json:
        from record import provenance, write
        write(a.json, out, provenance(argv, target),
              {"eyas": {"trainer": "eyas"}, "speculators": {"trainer": "speculators 0.9.0"}})
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
