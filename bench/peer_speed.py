"""Training speed against the peer trainers', side by side in one run: eyas's training loop,
speculators' and SpecForge's own model code and loss (bench/peer_recipe.py) on the same first
STEPS batches of a run's extraction, with the run's settings (precision included), alternated
`--rounds` times so that a drift of the machine falls on all:

    eyas bench peer-speed RUN_DIR [--steps 16] [--peers speculators specforge]
                                  [--set loss_tokens=all] [--json PATH]

Prints training tokens/s of each round and the ratio of eyas's to each peer's over the rounds
(issue goal: at least 1.3 against the fastest). Nothing of RUN_DIR is written: the drafts go to
a temporary directory.
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
    import peer_recipe

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--peers", nargs="+", choices=sorted(peer_recipe.TRAINERS),
                   default=sorted(peer_recipe.TRAINERS))
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="eyas's train settings changed from the run's, e.g. loss_tokens=all "
                        "(the peers train by their own recipes)")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    import torch

    from eyas.train.loop import train_draft
    from recipe_bench import run_settings

    run = a.run_dir.resolve()
    train, draft, target, _ = run_settings(run)
    from dataclasses import replace

    from omegaconf import OmegaConf
    ours = replace(train, **OmegaConf.to_container(OmegaConf.from_dotlist(a.set)))
    data = RunDir.of(run).extract
    rows = []
    with tempfile.TemporaryDirectory(prefix="eyas-peer-speed-") as tmp:
        for i in range(a.rounds):
            torch.set_num_threads(2)
            row = {"round": i, "eyas_tokens_per_s": train_draft(
                str(data), target, f"{tmp}/eyas{i}", ours, draft, stop_after=a.steps).tokens_per_s}
            for peer in a.peers:
                _, row[f"{peer}_tokens_per_s"] = peer_recipe.TRAINERS[peer](
                    data, target, Path(f"{tmp}/{peer}{i}"), train, draft, stop_after=a.steps)
            rows.append(row)
            print(f"round {i}: " + ", ".join(f"{k.removesuffix('_tokens_per_s')} {v:.0f}"
                                             for k, v in row.items() if k != "round")
                  + " tokens/s", flush=True)
    mean = {who: sum(r[f"{who}_tokens_per_s"] for r in rows) / len(rows)
            for who in ("eyas", *a.peers)}
    ratios = {peer: mean["eyas"] / mean[peer] for peer in a.peers}
    print(f"\n{a.steps} steps x {a.rounds} rounds on {data} (precision {train.precision}): "
          + ", ".join(f"{who} {v:.0f}" for who, v in mean.items()) + " tokens/s; eyas / "
          + ", ".join(f"{peer} {r:.2f}" for peer, r in ratios.items()))
    out = {"steps": a.steps, "eyas_settings": a.set, "rows": rows,
           **{f"{who}_tokens_per_s": v for who, v in mean.items()},
           **{f"ratio_{peer}": r for peer, r in ratios.items()}}
    if a.json:
        from record import provenance, write
        write(a.json, out, provenance(argv, target),
              {"eyas": {"trainer": "eyas", "settings": a.set},
               **{peer: {"trainer": peer} for peer in a.peers}})
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
