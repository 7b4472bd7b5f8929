"""Which tensor each vLLM aux id captures, on a tiny random Llama or Qwen3 (docs/engines.md).

Captures ids 0..N with vLLM's `extract_hidden_states` (through eyas.engines.vllm_capture, which
boots vLLM in-process with one torch thread and an explicit KV cache), then compares each
captured tensor with every HF `output_hidden_states` index and with a hook on the last decoder
layer's output (pre-norm). Prints, per id, the closest HF tensor and its max |difference|.

    python docs/scripts/vllm_capture_ids.py [--family llama|qwen3] [--layers 4] [--json OUT]

`--json` writes the record (bench/record.py) that docs/engines.md's table is generated from.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import _tiny


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("llama", "qwen3"), default="llama")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", help="also write the record here")
    args = parser.parse_args()
    n = args.layers

    import torch
    from transformers import AutoModelForCausalLM

    from eyas.conventions import hf
    from eyas.layout import Slot
    from eyas.engines.vllm_capture import capture_hidden_states

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        target = getattr(_tiny, args.family)(Path(tmp) / "target", layers=n)
        prompts = _tiny.prompts(target)
        got = capture_hidden_states(target, list(range(n + 1)), prompts)
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        print(_tiny.versions())
        print(f"{args.family}, {n} layers, {len(prompts)} prompts of "
              f"{[len(p) for p in prompts]} tokens")
        rows = []
        for i in range(n + 1):
            slot = Slot.at_stream_index(i, n)
            worst: dict[str, float] = {}
            for r, prompt in enumerate(prompts):
                ids = torch.tensor([prompt])
                with torch.no_grad():
                    reported = model(ids, output_hidden_states=True).hidden_states
                hook = hf.capture(model, ids, [Slot("block_out", n - 1)])[Slot("block_out", n - 1)]
                candidates = {f"HF hidden_states[{j}]": reported[j][0] for j in range(n + 1)}
                candidates[f"hook: layer {n - 1} output (pre-norm)"] = hook[0]
                for name, ref in candidates.items():
                    diff = (got[r][slot.name] - ref).abs().max().item()
                    worst[name] = max(worst.get(name, 0.0), diff)
            best = min(worst, key=worst.get)
            runner_up = sorted(worst.values())[1]
            print(f"vLLM id {i} ({slot.name}): closest {best}, max |diff| {worst[best]:.1e} "
                  f"(next closest {runner_up:.1e})")
            rows.append({"id": i, "slot": slot.name, "closest": best, "max_diff": worst[best],
                         "next_closest": runner_up})
        post = max((got[r][Slot('block_out', n - 1).name] - model(torch.tensor([p]),
                    output_hidden_states=True).hidden_states[n][0]).abs().max().item()
                   for r, p in enumerate(prompts))
        print(f"vLLM id {n} vs HF hidden_states[{n}] (after the final norm): max |diff| {post:.2f}")
        print(f"peak RSS {_tiny.rss_gib():.2f} GiB")
        if args.json:
            record = _tiny.records()
            record.write(args.json, {"family": args.family, "layers": n,
                                     "prompt_tokens": [len(p) for p in prompts], "ids": rows,
                                     "final_norm_diff": post},
                         record.provenance(sys.argv[1:], prompts=prompts),
                         {args.family: {"layers": n, "dtype": "float32"}}, shared=())


if __name__ == "__main__":
    main()
