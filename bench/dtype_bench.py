"""bfloat16 against float32 on this CPU, as it is and as a CPU without bfloat16 instructions:
what `auto` (target.dtype, train.precision; eyas/precision.py) decides from.

    python bench/dtype_bench.py [--rounds 3] [--tokens 64] [--json RECORD]

Two sides, each in a process of its own: this CPU as it is, and the same CPU with oneDNN (which
runs torch's CPU matmuls) capped at AVX2 by ONEDNN_MAX_CPU_ISA, the instructions an AVX2-only
CPU (an older EPYC, most laptops) has. On each, alternated `--rounds` times so the machine's
drift cancels, one thread:

    matmul       GFLOP/s of the draft's shapes (SmolLM2's width 576: fc, MLP, the 8192-row
                 draft head) on 512 tokens, float32 and bfloat16
    forward      tokens/s of a SmolLM2-135M-shaped Llama (30 blocks, random weights: the
                 cost, not the model) over one sequence of `--tokens` tokens

and the ratio bfloat16 / float32 of each: above 1, bfloat16 pays; far below, it is emulated.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIDES = {"this CPU": {}, "oneDNN capped at AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
# (tokens, in, out): fc over three slots, the MLP's up and down, the draft head
SHAPES = [(512, 1728, 576), (512, 576, 1536), (512, 1536, 576), (512, 576, 8192)]


def _smollm2_shaped():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         max_position_embeddings=2048, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def measure(rounds: int, tokens: int) -> dict:
    """One side, in this process: per round and dtype, matmul GFLOP/s and forward tokens/s."""
    import time

    import torch

    from eyas import precision

    torch.set_num_threads(1)
    torch.manual_seed(0)
    mats = [(torch.randn(n, i), torch.randn(i, o)) for n, i, o in SHAPES]
    flops = sum(2 * n * i * o for n, i, o in SHAPES)
    model = _smollm2_shaped()
    ids = torch.randint(0, 49152, (1, tokens))
    models = {"float32": model, "bfloat16": _smollm2_shaped().to(torch.bfloat16)}
    models["bfloat16"].load_state_dict(model.state_dict())
    out = {"support": vars(precision.cpu_bf16()),
           "capability": torch.backends.cpu.get_cpu_capability(), "rounds": []}
    for _ in range(rounds):
        row = {}
        for dtype in ("float32", "bfloat16"):  # alternated within each round
            cast = [(a.to(getattr(torch, dtype)), b.to(getattr(torch, dtype))) for a, b in mats]
            for a, b in cast:  # warm
                a @ b
            started = time.perf_counter()
            for a, b in cast:
                a @ b
            row[f"matmul_gflops_{dtype}"] = flops / (time.perf_counter() - started) / 1e9
            with torch.inference_mode():
                started = time.perf_counter()
                models[dtype](ids)
                row[f"forward_tokens_per_s_{dtype}"] = tokens / (time.perf_counter() - started)
        out["rounds"].append(row)
    return out


def _side(env: dict, rounds: int, tokens: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--side", "--rounds", str(rounds),
                           "--tokens", str(tokens)], env={**os.environ, **env},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(side: dict) -> dict:
    def mean(key):
        return sum(r[key] for r in side["rounds"]) / len(side["rounds"])
    row = {k: mean(k) for k in side["rounds"][0]}
    row["matmul_ratio"] = row["matmul_gflops_bfloat16"] / row["matmul_gflops_float32"]
    row["forward_ratio"] = (row["forward_tokens_per_s_bfloat16"]
                            / row["forward_tokens_per_s_float32"])
    return {**row, "support": side["support"], "capability": side["capability"],
            "auto_picks": "bfloat16" if side["support"]["native"] else "float32"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--json", help="write the record here")
    p.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.side:
        print(json.dumps(measure(a.rounds, a.tokens)))
        return 0
    rows = []
    for name, env in SIDES.items():
        rows.append({"side": name, "env": env, **summarize(_side(env, a.rounds, a.tokens))})
        r = rows[-1]
        print(f"{name} ({r['support']['where']}): matmul bf16/fp32 {r['matmul_ratio']:.3f} "
              f"({r['matmul_gflops_bfloat16']:.1f} / {r['matmul_gflops_float32']:.1f} GFLOP/s), "
              f"forward {r['forward_ratio']:.3f}; auto picks {r['auto_picks']}", flush=True)
    if a.json:
        from record import provenance, write
        write(a.json, {"rounds": a.rounds, "tokens": a.tokens, "rows": rows},
              provenance(sys.argv[1:]), {r["side"]: {"env": r["env"]} for r in rows},
              compared=("env",), shared=())
    return 0


if __name__ == "__main__":
    sys.exit(main())
