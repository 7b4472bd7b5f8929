"""The logits vLLM's drafter really computes, captured in-process: what a family's test holds
eyas's own forward to, so that the draft eyas trains is the function vLLM serves.

    with VllmEngine(target_dir, draft_dir, k) as engine:
        first = first_proposal(engine, prompt)
    first.hidden   # [n, n_slots*H_target] the target states vLLM passed the drafter (before fc)
    first.bonus    # the token the target sampled after the prompt
    first.logits   # [k, target vocab] the drafts' logits, position by position

The first proposal of a request is taken because its drafter sees exactly the prompt: no KV
cache of earlier steps, no rejected tokens. In eyas's alignment (eyas/draft/ttt.py) it is
row n-1 of input ids `prompt + [bonus]` with `hidden` as the draft inputs: position k of that
row is `logits[k]` (for chain EAGLE-3 only position 0 reads nothing the drafter chose itself).
vLLM maps a reduced vocabulary into the target's (d2t), -inf elsewhere: compare
`logits[:, vocab.target_ids]` with the draft's own logits.

Needs an in-process engine (eyas.engines.vllm_engine boots one: VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass
class FirstProposal:
    prompt: list[int]
    bonus: int
    hidden: torch.Tensor  # [n, n_slots*H_target], float32, on CPU
    logits: torch.Tensor  # [k, target vocab], float32, on CPU


def drafter(engine):
    """vLLM's proposer inside an in-process VllmEngine (its model is `.model`)."""
    core = engine.llm.llm_engine.engine_core
    if not hasattr(core, "engine_core"):
        raise RuntimeError("the engine runs in another process: boot it in-process "
                           "(VLLM_ENABLE_V1_MULTIPROCESSING=0, as eyas.engines.vllm_engine does)")
    return core.engine_core.model_executor.driver_worker.worker.model_runner.drafter


def first_proposal(engine, prompt: list[int]) -> FirstProposal:
    """Generate 2 tokens for `prompt` alone and return the drafter's first proposal."""
    proposer = drafter(engine)
    model = proposer.model
    signature = inspect.signature(proposer.propose)
    calls: list[dict] = []
    logits: list[torch.Tensor] = []
    propose, compute_logits = proposer.propose, model.compute_logits

    def recording_propose(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        first = not calls
        if first:
            calls.append({k: bound[k].detach().float().cpu().clone()
                          for k in ("target_token_ids", "target_hidden_states",
                                    "next_token_ids")})
        try:
            return propose(*args, **kwargs)
        finally:
            calls[0].setdefault("done", True)

    def recording_logits(hidden_states, *args, **kwargs):
        out = compute_logits(hidden_states, *args, **kwargs)
        if calls and "done" not in calls[0]:
            logits.append(out.detach().float().cpu().clone())
        return out

    proposer.propose, model.compute_logits = recording_propose, recording_logits
    try:
        engine.generate([prompt], 2)
    finally:
        proposer.propose, model.compute_logits = propose, compute_logits
    if not calls or not logits:
        raise RuntimeError("vLLM's drafter proposed nothing for this prompt")
    call = calls[0]
    tokens = call["target_token_ids"].long().tolist()
    if tokens != list(map(int, prompt)):
        raise RuntimeError(f"the drafter's first call saw tokens {tokens[:8]}..., not the prompt")
    drafts = torch.cat(logits)  # chain: one row per step; parallel: the k rows of one pass
    if drafts.shape[0] != engine.k:
        raise RuntimeError(f"the drafter computed {drafts.shape[0]} rows of logits in its first "
                           f"proposal, expected k={engine.k}")
    return FirstProposal(list(map(int, prompt)), int(call["next_token_ids"][0]),
                         call["target_hidden_states"], drafts)
