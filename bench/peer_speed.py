"""Training speed against the peer trainers', side by side in one run: eyas's training loop,
speculators' and SpecForge's own model code and loss (bench/peer_recipe.py) on the same first
STEPS batches of a run's extraction (`--steps 0`: each side's whole schedule, the run's
train.epochs), with the run's settings (precision included), alternated `--rounds` times so
that a drift of the machine falls on all:

    eyas bench peer-speed RUN_DIR [--steps 16] [--peers speculators specforge]
                                  [--set loss_tokens=all] [--json PATH]

Each side trains in a fresh Python process of its own, so that none inherits another's state
(the allocator's heap, thread pools, a library's global switches). Prints training tokens/s
of each round and the ratio of eyas's to each peer's over the rounds (issue goal: at least 1.3
against the fastest). Nothing of RUN_DIR is written: the drafts go to a temporary directory.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _one(run: Path, side: str, steps: int, sets: list[str], out: Path) -> float:
    """One side's training tokens/s, trained in this process."""
    import torch

    import peer_recipe
    from eyas.train.loop import train_draft
    from recipe_bench import changed, run_settings

    torch.set_num_threads(2)
    train, draft, target, _ = run_settings(run)
    stop_after = steps or None
    if side != "eyas":
        return peer_recipe.TRAINERS[side](RunDir.of(run).extract, target, out, train, draft,
                                          stop_after=stop_after)[1]
    return train_draft(str(RunDir.of(run).extract), target, str(out), changed(train, sets),
                       draft, stop_after=stop_after).tokens_per_s


def summary(rows: list[dict], peers, steps: int, settings) -> dict:
    """The rounds (each {SIDE}_tokens_per_s) summed up: each side's mean tokens/s, eyas's
    ratio to each peer from the means, and the range of the rounds' own ratios (each from
    sides trained back to back: the spread drift leaves). What bench/limits_bench.py's
    training row and the speed table read."""
    mean = {who: sum(r[f"{who}_tokens_per_s"] for r in rows) / len(rows)
            for who in ("eyas", *peers)}
    each = {peer: [r["eyas_tokens_per_s"] / r[f"{peer}_tokens_per_s"] for r in rows]
            for peer in peers}
    return {"steps": steps, "eyas_settings": settings, "rows": rows,
            **{f"{who}_tokens_per_s": v for who, v in mean.items()},
            **{f"ratio_{peer}": mean["eyas"] / mean[peer] for peer in peers},
            **{f"ratio_{peer}_range": [min(v), max(v)] for peer, v in each.items()}}


def main(argv: list[str]) -> dict:
    import peer_recipe

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", type=int, default=16,
                   help="the first STEPS batches of the schedule; 0: the whole schedule")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--peers", nargs="+", choices=sorted(peer_recipe.TRAINERS),
                   default=sorted(peer_recipe.TRAINERS))
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="eyas's train settings changed from the run's, e.g. loss_tokens=all "
                        "(the peers train by their own recipes)")
    p.add_argument("--json", type=Path)
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child process: this side alone
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)  # the child's draft and result
    a = p.parse_args(argv)
    run = a.run_dir.resolve()
    if a.one:
        tokens_per_s = _one(run, a.one, a.steps, a.set, a.out)
        (a.out / "tokens_per_s.json").write_text(json.dumps(tokens_per_s))
        return {"tokens_per_s": tokens_per_s}

    from recipe_bench import run_settings

    train, _, target, _ = run_settings(run)
    rows = []
    with tempfile.TemporaryDirectory(prefix="eyas-peer-speed-") as tmp:
        for i in range(a.rounds):
            row = {"round": i}
            for side in ("eyas", *a.peers):
                out = Path(tmp) / f"{side}{i}"
                out.mkdir()
                subprocess.run([sys.executable, __file__, str(run), "--one", side,
                                "--steps", str(a.steps), "--out", str(out),
                                *(["--set", *a.set] if a.set else [])], check=True)
                row[f"{side}_tokens_per_s"] = json.loads((out / "tokens_per_s.json").read_text())
            rows.append(row)
            print(f"round {i}: " + ", ".join(f"{k.removesuffix('_tokens_per_s')} {v:.0f}"
                                             for k, v in row.items() if k != "round")
                  + " tokens/s", flush=True)
    out = summary(rows, a.peers, a.steps, a.set)
    data = RunDir.of(run).extract
    print(f"\n{a.steps or 'all'} steps x {a.rounds} rounds on {data} (precision "
          f"{train.precision}): " + ", ".join(f"{who} {out[f'{who}_tokens_per_s']:.0f}"
                                             for who in ("eyas", *a.peers))
          + " tokens/s; eyas / " + ", ".join(
              f"{peer} {out[f'ratio_{peer}']:.2f} (rounds {out[f'ratio_{peer}_range'][0]:.2f}–"
              f"{out[f'ratio_{peer}_range'][1]:.2f})" for peer in a.peers))
    if a.json:
        from record import provenance, write
        # every trainer on the same stored batches, steps, batch size and precision; eyas's
        # own --set overrides are part of what is compared
        same = {"data": str(data), "steps": a.steps, "batch_size": train.batch_size,
                "precision": train.precision}
        write(a.json, out, provenance(argv, target),
              {"eyas": {"trainer": "eyas", "settings": a.set, **same},
               **{peer: {"trainer": peer, **same} for peer in a.peers}},
              compared=("trainer", "settings"), shared=tuple(same))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
