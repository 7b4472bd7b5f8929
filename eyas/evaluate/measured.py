"""Measured acceptance: real greedy speculative decoding (eyas/engines/reference.py) on
held-out prompts, and on the user's prompt sets replayed turn by turn.

Its τ is what the standalone prediction (predicted_tau from the per-position accuracy,
eyas/draft/accuracy.py) should come close to; the two side by side in the report are the
check that the prediction means something. Each request's counters are kept for the speculation
profiles (eyas/evaluate/profiles.py: their per-request mean).
"""
from __future__ import annotations

import torch

from eyas.layout import HiddenStateLayout
from eyas.acceptance import AcceptanceStats
from eyas.conversations.prompt_sets import Dialog, PromptSet
from eyas.engines.reference import generate_speculative
from eyas.progress import progress


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


def measure_requests(target_model, draft, layout: HiddenStateLayout, prompts, k: int,
                     max_new_tokens: int, eos_token_id: int | None = None
                     ) -> list[AcceptanceStats]:
    """Each prompt's counters (each decoded greedily with speculation), in order."""
    return [generate_speculative(target_model, draft, layout, prompt, k, max_new_tokens,
                                 eos_token_id)[1]
            for prompt in progress(prompts, desc="measured tau", unit=" prompts",
                                   leave=False)]


def measure_tau(target_model, draft, layout: HiddenStateLayout, prompts, k: int,
                max_new_tokens: int, eos_token_id: int | None = None) -> AcceptanceStats:
    """Counters summed over `prompts` (each decoded greedily with speculation)."""
    return total(measure_requests(target_model, draft, layout, prompts, k, max_new_tokens,
                                  eos_token_id), k)


def measure_set(target_model, draft, layout: HiddenStateLayout, prompt_set: PromptSet,
                k: int, max_new_tokens: int, chat) -> list[AcceptanceStats]:
    """Each request's counters over a prompt set, its conversations replayed turn by turn
    (eyas.conversations.prompt_sets.Dialog): each turn is one request, the target's own
    answer (cut at its EOS by `chat.decode`) standing in for the file's. As serving does, a
    request decodes max_new_tokens whatever its EOS (`chat`: chat_renderer's Renderer)."""
    out = []
    for conversation in progress(prompt_set.conversations, unit=" chats", leave=False,
                                 desc=f"measured tau, {prompt_set.name}"):
        dialog = Dialog(conversation, *chat)
        while not dialog.done:
            new, stats = generate_speculative(target_model, draft, layout, dialog.prompt(), k,
                                              max_new_tokens)
            dialog.answer(new)
            out.append(stats)
    return out


def total(requests: list[AcceptanceStats], k: int) -> AcceptanceStats:
    """The requests' counters summed (zeros at k positions when there is none)."""
    return sum(requests, AcceptanceStats(accepted_per_position=(0,) * k))


def request_means(requests: list[AcceptanceStats]) -> list[float]:
    """Each request's mean acceptance length, over the requests that drafted at all."""
    return [r.tau for r in requests if r.drafts]
