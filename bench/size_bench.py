"""Acceptance against data size: one family's draft trained on the first N training samples of
one run's extraction (nested subsets in file order, the run's train settings, the same number
of epochs at every N: larger N take proportionally more steps), each served by vLLM on the
held-out split and HumanEval at concurrency 1, interleaved request by request with the target
alone (two engines alive together: eyas.serve.latency.measure_interleaved).

  per N: training seconds and steps, held-out accuracy per position, predicted tau, served tau
  with its 95 % interval and per-position acceptance per prompt set, the time-per-token ratio
  with its interval (below 1: the draft pays), identical outputs

    python bench/size_bench.py RUN_DIR 40 80 160 320 --set epochs=3 --json out.json
    python bench/size_bench.py RUN_DIR 80 160 320 640 --family dflash-b4 --set epochs=1

`--family NAME` trains another family than the run's, in family_bench's shape for it (a family,
or one of its variants such as dflash-b4): the curve a family's accuracy draws against its
budget; `--set` changes its shape's settings too (`--set anchors=192`). Each curve is kept
apart, under RUN_DIR/sizes/NAME+KEY=VALUE.../N (its family and `--set`), so one curve never
retrains or removes another's drafts.

RUN_DIR went through extract (e.g. `eyas run target=smollm2 data=sharegpt data.max_train=320
'stages=[prepare,extract]'`). A size's draft is reused only when its settings and eyas's commit
are those it was trained with (RUN_DIR/sizes/N/size.json); otherwise it is trained afresh.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eyas.run_records import RunDir  # noqa: E402
from family_bench import FirstSamples  # noqa: E402  (the nested subsets)


def train_size(run: Path, n: int, train, draft, target, k: int, commit: str | None,
               curve: str = "") -> dict:
    import torch

    from family_bench import _score
    from eyas.train.loop import train_draft

    out = run / "sizes" / curve / str(n)
    settings = {"train": asdict(train), "draft": asdict(draft), "samples": n}
    record = out / "size.json"
    if record.exists():
        stored = json.loads(record.read_text())
        if stored["settings"] == settings and stored.get("commit") == commit and commit:
            return stored
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    for old in (out / "checkpoints").glob("step-*"):  # another setting's: start afresh
        import shutil
        shutil.rmtree(old)
    started = time.perf_counter()
    outcome = train_draft(FirstSamples(RunDir.of(run).extract, n), target, str(out), train,
                          draft)
    seconds = time.perf_counter() - started
    report = _score(run, out, settings, {"draft_dir": outcome.draft_dir, "steps": outcome.steps,
                                         "tokens_per_s": outcome.tokens_per_s},
                    target, draft, train, k)
    report.update(commit=commit, train_seconds=seconds, samples=n,
                  tokens=sum(FirstSamples(RunDir.of(run).extract, n).lengths()))
    record.write_text(json.dumps(report, indent=1))
    return report


def curve_settings(train, draft, family: str | None, dotlist: list[str], k: int):
    """(train, draft) of a curve: the run's, in `family`'s shape where one is named
    (family_bench), then `--set` over both, so that it can change the shape's own settings."""
    from family_bench import family_settings
    from recipe_bench import changed

    if family:
        train, draft = family_settings(family, train, draft, k, published=True)
    return changed(train, dotlist), draft


def main(argv: list[str]) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("sizes", nargs="+", type=int)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="train settings changed from the run's, e.g. epochs=3")
    p.add_argument("--family", help="train this family (or a variant: dflash-b4) in "
                   "family_bench's published shape instead of the run's draft")
    p.add_argument("--json", type=Path, help="also write the table and its record here")
    a = p.parse_args(argv)
    from family_bench import PUBLISHED, VARIANTS
    if a.family and a.family not in {**PUBLISHED, **VARIANTS}:
        raise SystemExit(f"--family {a.family}: size_bench trains one of "
                         f"{', '.join([*PUBLISHED, *VARIANTS])} (as family_bench shapes it)")
    import torch
    torch.set_num_threads(2)

    from eyas.evaluate.measured import heldout_prompts
    from eyas.store.reader import ExtractedDataset
    from family_bench import _served, humaneval_prompts, serve_interleaved, served_k
    from recipe_bench import run_settings
    from record import clean_commit

    run = a.run_dir.resolve()
    train, draft, target, serve_cfg = run_settings(run)
    train, draft = curve_settings(train, draft, a.family, a.set, a.k)
    k = served_k(draft, a.k)
    commit = clean_commit()
    sizes = sorted(set(a.sizes))
    # each curve (a family, changed settings) in its own folder: one never retrains another's
    curve = "+".join(filter(None, [a.family, *a.set]))
    trained = {n: train_size(run, n, train, draft, target, k, commit, curve) for n in sizes}
    prompts = heldout_prompts(ExtractedDataset(RunDir.of(run).extract, "heldout"), a.prompts)
    sets = {"heldout": prompts, "humaneval": humaneval_prompts(target, a.prompts)}
    served = serve_interleaved(target, {n: (trained[n]["draft_dir"], k) for n in sizes},
                               sets, a.max_new_tokens, serve_cfg)
    rows = []
    for n in sizes:
        t = trained[n]
        row = {"samples": n, "tokens": t["tokens"], "steps": t["steps"],
               "train_seconds": t["train_seconds"], "in_vocab": t["in_vocab"],
               "predicted_tau": t["predicted_tau"],
               **{name: _served(*served[n][name], target, serve_cfg.dtype) for name in sets}}
        rows.append(row)
    print(f"\n{len(prompts)} prompts a set x {a.max_new_tokens} tokens, greedy, concurrency 1 "
          f"interleaved with the target alone, k={k}, {serve_cfg.dtype}; "
          f"{train.epochs} epochs at every size; {a.family or draft.family}")
    print(f"{'N':>5} {'tokens':>8} {'train s':>8} {'acc d0/d1/d2':<15} {'pred τ':>6} "
          f"{'held-out τ ±95%':>16} {'ratio ±95%':>15} {'HumanEval τ':>12} {'ratio':>6}")
    for r in rows:
        h, e = r["heldout"], r["humaneval"]
        lo, hi = h["served_tau_interval"]
        rlo, rhi = h["ratio_interval"]
        print(f"{r['samples']:>5} {r['tokens']:>8} {r['train_seconds']:>8.0f} "
              f"{'/'.join(f'{x:.2f}' for x in r['in_vocab'][:3]):<15} "
              f"{r['predicted_tau']:>6.3f} {h['served_tau']:>9.3f}±{(hi - lo) / 2:.2f} "
              f"{h['ratio']:>8.3f}±{(rhi - rlo) / 2:.2f} {e['served_tau']:>12.3f} "
              f"{e['ratio']:>6.3f}")
    if a.json:
        from record import digest_prompts, engine_options_of, measured_under, provenance, write
        side = measured_under(prompts, a.max_new_tokens, serve_cfg.dtype, 1,
                              "one request of 2 tokens", target, k,
                              engine_options=engine_options_of(serve_cfg, interleave=True))
        side.update(prompts_humaneval=digest_prompts(sets["humaneval"]))
        write(a.json, rows, provenance(argv, target, {f"N={n}": trained[n]["draft_dir"]
                                                      for n in sizes}, prompts),
              {"without the draft": {**side, "draft": None},
               **{f"N={n}": {**side, "samples": n, "recipe": trained[n]["settings"],
                             "family": a.family or draft.family}
                  for n in sizes}}, compared=("samples", "recipe", "draft"))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
