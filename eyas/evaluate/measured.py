"""Measured acceptance: real greedy speculative decoding (eyas/engines/reference.py) on held-out prompts.

Its τ is what the standalone prediction (predicted_tau from the per-position accuracy,
eyas/draft/eagle3/accuracy.py) should come close to; the two side by side in the report are the check
that the prediction means something.
"""
from __future__ import annotations

import torch

from eyas.layout import HiddenStateLayout
from eyas.acceptance import AcceptanceStats
from eyas.engines.reference import generate_speculative


def heldout_prompts(dataset, count: int) -> list[list[int]]:
    """Prompts from a split: each sample's tokens up to its first assistant (loss-masked) token.

    E.g. '<s><|user|>\\nABC<|end|>\\n<|assistant|>\\n' of a conversation whose answer follows.
    Samples with no assistant token, or one at position 0, give no prompt.
    """
    prompts = []
    for i in range(len(dataset)):
        if len(prompts) == count:
            break
        sample = dataset[i]
        first = torch.nonzero(sample.loss_mask).flatten()
        if first.numel() and int(first[0]) > 0:
            prompts.append(sample.input_ids[:int(first[0])].tolist())
    return prompts


def measure_tau(target_model, draft, layout: HiddenStateLayout, prompts, k: int,
                max_new_tokens: int, eos_token_id: int | None = None) -> AcceptanceStats:
    """Counters summed over `prompts` (each decoded greedily with speculation)."""
    total = AcceptanceStats(accepted_per_position=(0,) * k)
    for prompt in prompts:
        _, stats = generate_speculative(target_model, draft, layout, prompt, k, max_new_tokens,
                                        eos_token_id)
        total = total + stats
    return total
