"""How many tokens to draft: one run's draft served by vLLM at several k, each k interleaved
request by request with the target alone (family_bench.serve_interleaved: the ratio with its
interval, the machine's drift cancelled), at concurrency 1 on the same held-out prompts.

  per k: served tau (tokens per verify step, with its 95 % interval), per-position acceptance,
  time per output token, and speculative / plain time per token (below 1: the draft pays)

    python bench/k_bench.py RUN_DIR [K ...]     # default K: 1 2 3 4 5
    python bench/k_bench.py RUN_DIR --prompts 16 --max-new-tokens 64 --json out.json

RUN_DIR went through train (RUN_DIR/train/draft), or `--draft DIR` names another draft trained on
its extraction (a recipe bench's: RUN_DIR/recipes/NAME/draft); the engine computes in the run's
serve.dtype on its serve.cpu_threads. Lossless is judged as the serve stage judges it (each
parting scored by the target in float32: a near-tie passes). A draft trained with train.ttt_steps=n is trained for k <= n only:
larger k are served, but their deep positions were never trained.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str]) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("ks", nargs="*", type=int, default=[1, 2, 3, 4, 5])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--draft", type=Path, help="the draft to serve (default RUN_DIR/train/draft)")
    p.add_argument("--json", type=Path, help="also write the table and its record here "
                   "(bench/record.py; bench/validate.py checks it)")
    a = p.parse_args(argv)
    import torch
    torch.set_num_threads(2)

    from eyas.evaluate.measured import heldout_prompts
    from eyas.store.reader import ExtractedDataset
    from family_bench import _served, serve_interleaved
    from recipe_bench import run_settings

    run = a.run_dir.resolve()
    train, _, target, serve_cfg = run_settings(run)
    draft = a.draft.resolve() if a.draft else RunDir.of(run).draft
    if not (draft / "config.json").exists():
        raise SystemExit(f"{draft}: no trained draft; run the pipeline through train first")
    prompts = heldout_prompts(ExtractedDataset(RunDir.of(run).extract, "heldout"), a.prompts)
    served = serve_interleaved(target, {k: (str(draft), k) for k in a.ks},
                               {"heldout": prompts}, a.max_new_tokens, serve_cfg)
    rows = []
    for k in a.ks:
        plain, spec = served[k]["heldout"]
        figures = _served(plain, spec, target, serve_cfg.dtype)
        rows.append({"k": k, "tau": figures["served_tau"],
                     "tau_interval": figures["served_tau_interval"],
                     "per_position": figures["per_position"], "drafts": figures["drafts"],
                     **{key: figures[key] for key in ("tpot_ms", "tpot_ms_plain", "ratio",
                                                      "ratio_interval", "lossless",
                                                      "partings")},
                     "lossless_outputs": figures["identical_outputs"]})
        print(f"k={k}: served tau {rows[-1]['tau']:.3f}, {rows[-1]['tpot_ms']:.1f} ms/token "
              f"(plain {rows[-1]['tpot_ms_plain']:.1f})", flush=True)
    print(f"\n{len(prompts)} held-out prompts x {a.max_new_tokens} tokens, concurrency 1, "
          f"{serve_cfg.dtype}; the draft trained with ttt_steps={train.ttt_steps}")
    print(f"{'k':>2} {'tau':>6} {'95% interval':>15} {'ms/token':>9} {'plain':>7} "
          f"{'ratio':>6} {'identical':>9}  acceptance per position")
    for r in rows:
        lo, hi = r["tau_interval"]
        print(f"{r['k']:>2} {r['tau']:>6.3f} {f'{lo:.2f}-{hi:.2f}':>15} {r['tpot_ms']:>9.1f} "
              f"{r['tpot_ms_plain']:>7.1f} {r['ratio']:>6.2f} "
              f"{r['lossless_outputs']:>4}/{len(prompts):<4}  "
              + " ".join(f"{x:.2f}" for x in r["per_position"]))
    if a.json:
        from record import engine_options_of, measured_under, provenance, write
        side = measured_under(prompts, a.max_new_tokens, serve_cfg.dtype, 1,
                              "one request of 2 tokens", target,
                              engine_options=engine_options_of(serve_cfg, interleave=True))
        sides = {"without the draft": {**side, "k": 0, "draft": None},
                 **{f"k={r['k']}": {**side, "k": r["k"], "draft": str(draft)} for r in rows}}
        write(a.json, rows, provenance(argv, target, {"draft": draft}, prompts), sides,
              compared=("k", "draft"))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
