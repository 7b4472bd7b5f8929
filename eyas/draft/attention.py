"""Attention over the training-time-test cache, shared by the draft's attentions (Llama's in
eyas/draft/eagle3/model.py, multi-head latent attention's in eyas/draft/eagle3/mla.py): step k
of the unroll (eyas/draft/ttt.py) attends what the draft's KV cache holds at inference."""
from __future__ import annotations

import torch


class TTTCache(list):
    """Per TTT step, the keys/values the draft attention produced: [(k, v)], each
    [B, kv_heads, T, head_dim] after RoPE. Step 0's are attended causally; later steps' only
    on the diagonal (see eyas/draft/ttt.py). `hide_recent`: step k's row r does not see step
    0's rows r-k+1..r (train.ttt_scheme=specforge)."""

    hide_recent: bool = False


def extend_attention(q, steps, rep: int, scale: float, hide_recent: bool = False):
    """Row t of step k attends step 0's rows <= t (causal) and row t of steps 1..k.

    That is exactly the draft's KV cache at inference when the target's context ends at
    row t and k tokens have been drafted after it; scores for the later steps are a dot
    product per row, so no [T, k*T] mask is built. `steps`: [(k, v)] per step, each
    [B, kv_heads, T, d] (k and v may differ in d: MLA); `rep` query heads share a kv head.
    `hide_recent`: step k's row t sees step 0's rows <= t - k only (train.ttt_scheme=specforge).
    """
    k0, v0 = (s.repeat_interleave(rep, dim=1) for s in steps[0])  # [B, heads, T, d]
    t = q.shape[2]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril(
        -(len(steps) - 1) if hide_recent else 0)
    q = q * scale  # on [B, h, T, d], not on the [B, h, T, T] scores
    first = (q @ k0.transpose(-1, -2)).masked_fill(~causal, float("-inf"))
    later = [tuple(s.repeat_interleave(rep, dim=1) for s in step) for step in steps[1:]]
    diag = torch.stack([(q * kj).sum(-1) for kj, _ in later], dim=-1)  # [B,h,T,k]
    # softmax in float32 (its dtype= reads the bf16 scores without a float32 copy of them)
    weights = torch.cat([first, diag], dim=-1).softmax(-1, dtype=torch.float32).to(q.dtype)
    out = weights[..., :t] @ v0
    for j, (_, vj) in enumerate(later):
        out = out + weights[..., t + j, None] * vj
    return out  # [B, heads, T, d_v]
