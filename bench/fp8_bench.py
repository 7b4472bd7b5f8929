"""FP8 stored states against bfloat16, one run: the run's draft (trained on its bfloat16
extraction) beside a draft trained the same way on the same data stored in float8_e4m3fn.

    python bench/fp8_bench.py RUN_DIR OUT_DIR [--prompts 32] [--max-new-tokens 64] [--k 3]
                              [--json PATH]

OUT_DIR (new) gets a copy of RUN_DIR/prepare and the run's config with
extract.dtype=float8_e4m3fn, and the pipeline extracts and trains there (timed). Both drafts
are then served by vLLM on the same held-out prompts, one after the other: bytes per token
stored, served tau with its 95 % interval, per-position acceptance, held-out accuracy while
training; and serve's parity on the float8 probe (vLLM's fed states against float8's stored
ones, within float8's rounding). --json writes the table and its record (bench/record.py).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # record, recipe_bench


def _config(run: Path, out: Path):
    from omegaconf import OmegaConf

    from eyas.config import PipelineConfig
    from workflows.config import _validate

    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PipelineConfig),
                                              OmegaConf.load(run / "config.yaml")))
    cfg.run_dir, cfg.stages = str(out), ["prepare", "extract", "train"]
    cfg.extract = replace(cfg.extract, dtype="float8_e4m3fn")
    cfg.mlflow = replace(cfg.mlflow, run_name=f"fp8-{run.name}")
    _validate(cfg)
    return cfg


def _served(target_dir, draft, k, options, prompts, max_new_tokens) -> dict:
    from eyas.engines.vllm_engine import VllmEngine

    with VllmEngine(target_dir, draft, k, options) as engine:
        result = engine.generate(prompts, max_new_tokens)
    acc = result.acceptance.to_dict()
    return {"tau": acc["tau"], "tau_interval": acc["tau_interval"], "drafts": acc["drafts"],
            "per_position": acc["per_position_rate"], "engine": result.engine_version}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)

    from eyas.evaluate.measured import heldout_prompts
    from eyas.extract.on_demand import open_split
    from eyas.serve.parity import engine_options
    from recipe_bench import run_settings
    from workflows import pipeline

    run, out = a.run_dir.resolve(), a.out_dir.resolve()
    if out.exists():
        raise SystemExit(f"{out} exists: name a new directory (nothing is overwritten)")
    cfg = _config(run, out)
    out.mkdir(parents=True)
    shutil.copytree(RunDir.of(run).prepare, RunDir.of(out).prepare)  # the same data, prepared once
    started = time.perf_counter()
    pipeline.run(cfg)
    seconds = time.perf_counter() - started

    _, _, target_dir, serve_cfg = run_settings(run)
    prompts = heldout_prompts(open_split(RunDir.of(run).extract, "heldout", states=False), a.prompts)
    options = replace(engine_options(max(map(len, prompts)) + a.max_new_tokens + a.k + 1,
                                     serve_cfg), max_num_seqs=len(prompts))
    rows = []
    for name, side in (("bfloat16", run), ("float8_e4m3fn", out)):
        manifest = json.loads((RunDir.of(side).extract / "manifest.json").read_text())
        tokens = sum(t["tokens"] for t in manifest["totals"].values())
        report = json.loads((RunDir.of(side).stage("train") / "train_report.json").read_text())
        row = {"dtype": name, "tensor_bytes": manifest["tensor_bytes"], "tokens": tokens,
               "bytes_per_token": manifest["tensor_bytes"] / tokens,
               "heldout_accuracy": report["heldout_accuracy"], "steps": report["steps"],
               **_served(target_dir, RunDir.of(side).draft, a.k, options, prompts,
                         a.max_new_tokens)}
        rows.append(row)
        print(f"{name}: {row['bytes_per_token']:.0f} bytes/token, tau {row['tau']:.3f} "
              f"[{row['tau_interval'][0]:.3f}, {row['tau_interval'][1]:.3f}]", flush=True)
    from eyas.serve.parity import check_parity
    parity = check_parity("vllm", target_dir, RunDir.of(out).draft, RunDir.of(out).extract,
                          cfg=serve_cfg)  # the probe stored in float8 against what vLLM feeds
    fp8_parity = {"ok": parity["ok"], "message": parity["message"]}
    print(fp8_parity["message"], flush=True)
    bf16, fp8 = rows
    result = {"run": str(run), "fp8_run": str(out), "extract_train_seconds": seconds,
              "k": a.k, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
              "bytes_ratio": fp8["bytes_per_token"] / bf16["bytes_per_token"],
              "tau_ratio": fp8["tau"] / bf16["tau"], "fp8_parity": fp8_parity, "rows": rows}
    print(f"\nfloat8 / bfloat16: bytes {result['bytes_ratio']:.3f}, served tau "
          f"{result['tau_ratio']:.3f}; float8's tau inside bfloat16's interval: "
          f"{bf16['tau_interval'][0] <= fp8['tau'] <= bf16['tau_interval'][1]}")
    if a.json:
        from record import engine_options_of, measured_under, provenance, write
        side = measured_under(prompts, a.max_new_tokens, serve_cfg.dtype, len(prompts), None,
                              target_dir, a.k, rows[0]["engine"],
                              engine_options=engine_options_of(serve_cfg))
        write(a.json, result, provenance(argv, target_dir, {
            "bfloat16": RunDir.of(run).draft, "float8_e4m3fn": RunDir.of(out).draft},
            prompts), {r["dtype"]: {**side, "stored": r["dtype"]} for r in rows},
              compared=("stored",))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
