"""The machine-limit tables (bench/limits_bench.py, bench/dtype_bench.py), for
docs/scripts/tables.py, which hands each its table writer."""
from __future__ import annotations


def _s(name: str) -> str:
    return "'" if name.endswith("s") else "'s"


def limits_table(record: dict, _table) -> str:
    """Each stage beside its limit (bench/limits_bench.py). Online against offline has its own
    record and table (docs/records/online_smollm2.json); the copy older limits records carry
    is not shown, so that no figure is read from a record other than its own."""
    r, rows = record["rows"], []
    best = max(r["regeneration"], key=lambda x: x["tokens_per_s"])
    for x in r["regeneration"]:
        rows.append(["regeneration (vLLM replicas in Ray actors)",
                     f"{x['replicas']} replica(s) x {x['threads_per_replica']} thread(s)"
                     + (", eyas's choice" if x.get("eyas_default") else ""),
                     f"{x['answers_per_s']:.2f} answers/s, {x['tokens_per_s']:.0f} tokens/s",
                     f"{x['tokens_per_s'] / best['tokens_per_s']:.2f} of the best setting"])
    e = r["extraction"]
    rows.append(["extraction, in process", f"`{e['dtype']}`, {e['shards']} shards",
                 f"{e['extract_tokens_per_s']:.0f} tokens/s",
                 f"{1 / e['time_ratio']:.3f} of a bare forward's {e['bare_tokens_per_s']:.0f} "
                 "(goal ≥ 0.9)"])
    if e.get("stage_tokens_per_s") and e.get("stage_bare_tokens_per_s"):
        rows.append(["extraction, the Ray stage", "start to manifest, replicas booted",
                     f"{e['stage_tokens_per_s']:.0f} tokens/s",
                     f"{e['stage_tokens_per_s'] / e['stage_bare_tokens_per_s']:.3f} of its bare "
                     f"forward's {e['stage_bare_tokens_per_s']:.0f}"])
    fast = min(r["serving"], key=lambda x: x["ms_per_token_c1"])
    for x in r["serving"]:
        rows.append(["serving, no draft (vLLM)", f"{x['threads']} thread(s)",
                     f"{x['ms_per_token_c1']:.1f} ms/token at c=1, {x['tokens_per_s_c4']:.0f} "
                     "tokens/s at c=4",
                     f"{fast['ms_per_token_c1'] / x['ms_per_token_c1']:.2f} of the fastest"])
    t = r["training"]  # bench/peer_speed.py's summary
    peers = [k.removeprefix("ratio_") for k in t if k.startswith("ratio_")
             and not k.endswith("_range")]
    rows.append(["training", f"{t['steps']} steps x {len(t['rows'])} rounds, same batches",
                 f"eyas {t['eyas_tokens_per_s']:.0f} tokens/s",
                 ", ".join(f"{t[f'ratio_{peer}']:.2f}x {peer}{_s(peer)} "
                           f"{t[f'{peer}_tokens_per_s']:.0f}"
                           + (" (rounds {:.2f}–{:.2f})".format(*t[f"ratio_{peer}_range"])
                              if f"ratio_{peer}_range" in t else "") for peer in sorted(peers))
                 + " (goal ≥ 1.3)"])
    return _table(["stage", "setting", "measured", "against its limit"], rows)


def dtype_table(record: dict, _table) -> str:
    """bfloat16 against float32 per side (bench/dtype_bench.py): what auto picks there."""
    out = record["rows"]
    rows = [[r["side"], r["support"]["where"], f"`{r['capability']}`",
             f"{r['matmul_gflops_float32']:.1f} / {r['matmul_gflops_bfloat16']:.1f} GFLOP/s",
             f"{r['matmul_ratio']:.3f}",
             f"{r['forward_tokens_per_s_float32']:.0f} / "
             f"{r['forward_tokens_per_s_bfloat16']:.0f} tokens/s",
             f"{r['forward_ratio']:.3f}", f"`{r['auto_picks']}`"] for r in out["rows"]]
    return _table(["side", "what computes", "torch's kernels", "matmul float32 / bfloat16",
                   "bf16 / fp32", f"SmolLM2-shaped forward ({out['tokens']} tokens) float32 / "
                   "bfloat16", "bf16 / fp32", "auto picks"], rows)
