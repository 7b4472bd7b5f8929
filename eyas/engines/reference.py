"""Greedy chain speculative decoding: one pure verify step, and a reference driver around it.

The verify step (`eyas.acceptance.verify_greedy`, gpt-fast's `speculative_decode` at
temperature 0) is the maths; `generate_speculative` runs it for real with
an HF target and an EAGLE-3 draft, and reports the counters engines report, as the
engine-neutral `AcceptanceStats` the vLLM engine returns too:

    drafts        verify steps (rounds), each carrying k drafted tokens
    accepted      drafted tokens accepted, summed over rounds
    accepted_per_position[i]   rounds that accepted more than i tokens
    tau           mean acceptance length = 1 + accepted / drafts  (vLLM's definition)
E.g. k = 3, rounds accepting [3, 0, 1]: accepted 4, per position [2, 1, 1], tau = 1 + 4/3.

The target keeps a KV cache: each round it computes only the last committed token and the k
drafts, and the cache is cut back to the committed context after verification (a rejected
draft's keys and values are dropped), so a round costs k+1 positions however long the context
(recomputing the whole context every round was 4.5 of the evaluate stage's 11 minutes on
SmolLM2). The draft runs over the whole context plus its own drafts (no cache: it is one layer).
"""
from __future__ import annotations

import torch

from eyas.conventions import hf
from eyas.layout import FINAL_NORM, HiddenStateLayout
from eyas.acceptance import AcceptanceStats, verify_greedy
from eyas.draft.spec import ParallelDraft


@torch.no_grad()
def _target_step(target_model, layout: HiddenStateLayout, ids: torch.Tensor, cache=None):
    """Target over ids [L] (after the cache's positions, if any) -> (greedy next token after
    each position [L], aux states [L, n*H])."""
    slots = hf.capture(target_model, ids[None], [*layout.draft_inputs, FINAL_NORM],
                       past_key_values=cache)
    # lm_head(final norm output) is exactly the HF causal LM's logits (Llama/Qwen/DeepSeek)
    logits = target_model.get_output_embeddings()(slots[FINAL_NORM][0])  # [L, V]
    aux = torch.cat([slots[s][0] for s in layout.draft_inputs], dim=-1)  # [L, n*H]
    return logits.argmax(-1), aux


@torch.no_grad()
def propose(draft, aux: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """k chain drafts after `tokens` [L] from the target's aux states [L-1, n*H] of positions
    0..L-2 (the last token has not been through the target yet). Returns target ids [k].

    Rows are vLLM's alignment (eyas/draft/ttt.py): row r = (fc(aux_r), token r+1, position r).
    Each later draft appends a row (the state it feeds back, the drafted token, next position);
    plain causal attention over these rows is the draft's KV cache at inference. A family that
    drafts a step's k tokens in one pass (`draft_steps`: P-EAGLE, DFlash) reads none of its own
    drafts: its proposals are row L-2 of its k positions.
    """
    if isinstance(draft, ParallelDraft):
        rows = torch.cat([aux, aux.new_zeros(1, aux.shape[1])]).to(draft.fc.weight.dtype)
        steps = draft.draft_steps(draft, tokens[None], rows[None], k, "inference")
        return torch.stack([draft.vocab.to_target(logits[0, -2].argmax())
                            for _, logits in steps])
    hidden = draft.project(aux.to(draft.fc.weight.dtype))  # [L-1, H]
    inputs = tokens[1:]  # [L-1]
    vocab = draft.vocab
    out = []
    for _ in range(k):
        positions = torch.arange(inputs.shape[0], device=inputs.device)
        fed_back, logits = draft(inputs[None], hidden[None], positions, projected=True)
        guess = vocab.to_target(logits[0, -1].argmax())  # draft id -> target id via d2t
        out.append(guess)
        hidden = torch.cat([hidden, fed_back[0, -1:]])  # [rows+1, H]
        inputs = torch.cat([inputs, guess[None]])
    return torch.stack(out)


@torch.no_grad()
def generate_speculative(target_model, draft, layout: HiddenStateLayout, prompt_ids, k: int,
                         max_new_tokens: int, eos_token_id: int | None = None
                         ) -> tuple[list[int], AcceptanceStats]:
    """Greedy speculative decoding; the output equals the target's plain greedy decoding.

    `layout` is the draft's (which target slots feed its fc). Returns the new tokens (at most
    max_new_tokens, cut after `eos_token_id` when given) and this generation's counters.
    """
    if k < 1 or max_new_tokens < 1:
        raise ValueError(f"k={k}, max_new_tokens={max_new_tokens}: both must be >= 1")
    layout.expect_draft_inputs(draft.config.num_aux_hidden_states, "the draft's fc")
    device = next(target_model.parameters()).device  # the draft must be there too
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)  # [P]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError("prompt_ids must be a non-empty 1-D sequence of token ids")
    prompt_len = ids.numel()
    rounds: list[int] = []  # drafts accepted per verify round

    def ended(tokens: torch.Tensor) -> bool:
        return eos_token_id is not None and eos_token_id in tokens.tolist()
    from transformers import DynamicCache

    cache = DynamicCache()
    # prefill: the target's first token, and aux states of every prompt position
    greedy, aux = _target_step(target_model, layout, ids, cache)
    ids = torch.cat([ids, greedy[-1:]])
    done = ended(greedy[-1:])
    while ids.numel() - prompt_len < max_new_tokens and not done:
        # aux: states of the committed context but its last token (not through the target yet)
        drafts = propose(draft, aux, ids, k)  # [k]
        L = ids.numel()  # the cache holds positions 0..L-2
        step, new_aux = _target_step(target_model, layout, torch.cat([ids[-1:], drafts]), cache)
        n, emitted = verify_greedy(drafts, step)  # step[i]: after c + d_1..d_i
        rounds.append(n)
        cache.crop(L + n)  # keep positions 0..L-1+n: the last token and the n accepted drafts
        aux = torch.cat([aux, new_aux[:n + 1]])
        ids = torch.cat([ids, emitted])
        done = ended(emitted)
    new = ids[prompt_len:].tolist()[:max_new_tokens]
    if eos_token_id is not None and eos_token_id in new:
        new = new[:new.index(eos_token_id) + 1]
    return new, AcceptanceStats.from_rounds(rounds, k)


@torch.no_grad()
def greedy_reference(target_model, prompt_ids, max_new_tokens: int) -> list[int]:
    """Plain greedy decoding, recomputing the full context each token (what spec must equal)."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    for _ in range(max_new_tokens):
        logits = target_model(input_ids=ids[None], use_cache=False).logits[0, -1]
        ids = torch.cat([ids, logits.argmax()[None]])
    return ids[len(prompt_ids):].tolist()
