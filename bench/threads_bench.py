"""Torch threads for the vLLM engine that serves a run's target on this machine: one thread
against every core, each booted in turn in alternating order (1, N, N, 1, ...), so that the
machine's drift cancels in the pairs; each boot measured as bench/limits_bench.py measures
serving (ms per token at concurrency 1 over 4 held-out prompts x 64 tokens, tokens/s with the
4 at once).

    python bench/threads_bench.py RUN_DIR [--rounds 4] [--json PATH]

RUN_DIR went through extract, in the run's serve.dtype (the demo: runs/demo, whose built-in
target is served on one thread: conf/target/builtin.yaml). Printed and recorded: each boot's
figures, each thread count's mean, and every core's time per token over one thread's, paired
round by round (below 1: more threads decode faster).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eyas.run_records import RunDir  # noqa: E402


def summary(boots: list[dict], cores: int) -> dict:
    """Each thread count's mean, and the paired ratio of `cores` threads' ms per token (and
    tokens/s with 4 at once) to one thread's, round by round."""
    rounds = sorted({b["round"] for b in boots})
    by = {(b["round"], b["threads"]): b for b in boots}
    mean = [{"threads": t, **{key: sum(by[r, t][key] for r in rounds) / len(rounds)
                              for key in ("ms_per_token_c1", "tokens_per_s_c4")}}
            for t in sorted({1, cores})]
    c1 = [by[r, cores]["ms_per_token_c1"] / by[r, 1]["ms_per_token_c1"] for r in rounds]
    c4 = [by[r, cores]["tokens_per_s_c4"] / by[r, 1]["tokens_per_s_c4"] for r in rounds]
    return {"per_threads": mean,
            "ratio_c1": sum(c1) / len(c1), "ratio_c1_range": [min(c1), max(c1)],
            "speed_c4": sum(c4) / len(c4), "speed_c4_range": [min(c4), max(c4)]}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--json", type=Path, help="also write the record here (bench/record.py)")
    a = p.parse_args(argv)

    from eyas.evaluate.measured import heldout_prompts
    from eyas.store.reader import ExtractedDataset
    from limits_bench import CORES, serving
    from recipe_bench import run_settings

    run = a.run_dir.resolve()
    _, _, target, serve_cfg = run_settings(run)
    prompts = heldout_prompts(ExtractedDataset(RunDir.of(run).extract, "heldout"), 4)
    boots = []
    for r in range(a.rounds):
        order = (1, CORES) if r % 2 == 0 else (CORES, 1)
        boots += [{"round": r, **row} for row in serving(target, prompts, serve_cfg.dtype, order)]
    result = {"cores": CORES, "dtype": serve_cfg.dtype, "boots": boots, **summary(boots, CORES)}
    lo, hi = result["ratio_c1_range"]
    print(f"{CORES} threads against 1, {a.rounds} rounds alternated: time per token at "
          f"concurrency 1 x{result['ratio_c1']:.2f} ({lo:.2f}-{hi:.2f}), tokens/s with 4 at once "
          f"x{result['speed_c4']:.2f}", flush=True)
    if a.json:
        from record import provenance, write
        write(a.json, result, provenance(argv, target),
              {"serving": {"prompts": 4, "max_new_tokens": 64, "dtype": serve_cfg.dtype}},
              shared=())  # one engine booted with each thread count: nothing else differs
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
