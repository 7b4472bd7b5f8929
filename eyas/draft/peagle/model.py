"""The P-EAGLE draft: EAGLE-3's model (eyas.draft.eagle3.model) drafting every token of a step
in one causal pass, as vLLM 0.32 serves an `eagle3` draft with `parallel_drafting`
(v1/spec_decode/llm_base_proposer.py, model_executor/models/llama_eagle3.py).

One drafting step of vLLM, context x_1..x_n, target states aux_0..aux_{n-1}, K drafts:

    tokens    [x_1 .. x_{n-1}, bonus=x_n, mask, .., mask]     mask = mask_token_id, K-1 times
    hidden    [fc(aux_0) .. fc(aux_{n-1}), fc(mask_hidden) x (K-1)]
    positions [0 .. n-1, n .. n+K-2]                          consecutive
    logits at the last K rows are the K drafts (row n-1 predicts x_{n+1}, mask j x_{n+1+j})

`fc(mask_hidden)` is vLLM's `combine_hidden_states(mask_hidden)`: the same norms as the
target's states (input_norm with norm_before_fc, per-slot fc_norm) before fc. The mask
positions read the target's (frozen, shared) embedding of `mask_token_id`.

Layers (num_layers): layer 0 is EAGLE-3's `midlayer` (2H-wide attention over
[input_layernorm(embeds), hidden_norm(h)], optional norm_before_residual); layers 1.. are
plain Llama decoder layers over the residual stream (vLLM's llama_eagle3 `layer_idx > 0`:
no embeddings, no hidden_norm), saved as `layers.{i}.*`. The final norm and lm_head follow.

In the alignment of eyas/draft/ttt.py (`draft_steps`): step 0 row r = EAGLE-3's (fc(h_r),
x_{r+1}, position r); step k >= 1 row r = (fc(mask_hidden), mask_token_id, position r+k),
attending step 0's rows <= r and its own row's steps 1..k: exactly vLLM's pass with the
context ending at row r, so the TTT loss, the accuracies and predicted tau hold unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from eyas.draft.attention import TTTCache
from eyas.draft.eagle3.model import DraftAttention, DraftMLP, Eagle3Config, Eagle3Draft
from eyas.draft.vocab import DraftVocab
from eyas.nn import RMSNorm


@dataclass(frozen=True)
class PEagleConfig(Eagle3Config):
    # the token id the mask positions read (the target's embedding of it): `mask_token_id`
    mask_token_id: int = 0
    num_layers: int = 1  # decoder layers (vLLM's num_hidden_layers)


class PlainLayer(nn.Module):
    """A later layer (vLLM's llama_eagle3 LlamaDecoderLayer with layer_idx > 0): a Llama decoder
    layer over the residual stream x, attention input H wide.
    x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.))."""

    def __init__(self, cfg: PEagleConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        h, attn = cfg.hidden_size, self.self_attn
        for name, out in (("q_proj", attn.heads), ("k_proj", attn.kv_heads),
                          ("v_proj", attn.kv_heads)):  # H wide, not [embeds, hidden]'s 2H
            setattr(attn, name, nn.Linear(h, out * attn.head_dim, bias=False))
        self.mlp = DraftMLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class PEagleDraft(Eagle3Draft):
    """Eagle3Draft plus a learned `mask_hidden` [n_slots*H_target] (what vLLM puts in place of
    the target's states at the mask positions) and `num_layers - 1` later layers."""

    def __init__(self, config: PEagleConfig, target_embedding, vocab: DraftVocab):
        if config.mla:
            raise ValueError("a P-EAGLE draft is vLLM's Llama EAGLE-3 layer; an MLA layer "
                             "(Eagle3DeepseekV2ForCausalLM) is not built for parallel drafting")
        if config.num_layers < 1:
            raise ValueError(f"num_layers={config.num_layers}: at least one layer")
        if not 0 <= config.mask_token_id < config.vocab_size:
            raise ValueError(f"mask_token_id {config.mask_token_id} outside the target's "
                             f"vocabulary of {config.vocab_size}")
        super().__init__(config, target_embedding, vocab)
        width = config.num_aux_hidden_states * config.target_hidden_size
        # the slots' scale: the norms before fc (or fc alone) see a state-like input
        self.mask_hidden = nn.Parameter(torch.randn(width) * 0.02)
        self.layers = nn.ModuleDict({str(i): PlainLayer(config)
                                     for i in range(1, config.num_layers)})

    def new_caches(self, scheme: str = "inference") -> list[TTTCache]:
        """One TTT cache per layer (each layer attends its own keys)."""
        caches = [TTTCache() for _ in range(self.config.num_layers)]
        for cache in caches:
            cache.hide_recent = scheme == "specforge"
        return caches

    def forward(self, token_ids, hidden, positions=None, *, projected: bool = False,
                cache: list[TTTCache] | None = None):
        """token_ids [B, T]; hidden [B, T, n_slots*H_target] (or [B, T, H] if `projected`),
        or None: every row is a mask row, fed fc(mask_hidden). `cache`: one TTTCache per
        layer (`new_caches`), this call being one TTT step.

        Returns (prenorm [B, T, H] (normed with norm_output), logits [B, T, draft_vocab]).
        """
        if hidden is None:  # vLLM's combine_hidden_states(mask_hidden): norms, then fc
            b, t = token_ids.shape
            hidden, projected = self.project(self.mask_hidden).expand(b, t, -1), True
        caches = cache if cache is not None else [None] * self.config.num_layers
        if len(caches) != self.config.num_layers:
            raise ValueError(f"{len(caches)} caches for {self.config.num_layers} layers")
        hidden, embeds, cos, sin = self.inputs(token_ids, hidden, positions, projected)
        x = self.midlayer(embeds, hidden, cos, sin, caches[0])  # pre-norm [B, T, H]
        for i, layer in enumerate(self.layers.values(), start=1):
            x = layer(x, cos, sin, caches[i])
        normed = self.norm(x)
        return (normed if self.config.norm_output else x), self.lm_head(normed)

    def draft_steps(self, call, input_ids: torch.Tensor, hidden: torch.Tensor, steps: int,
                    scheme: str = "inference") -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft position k < steps: (output [B, T, H], logits [B, T, draft_vocab]) where
        row r predicts x_{r+k+2} (eyas/draft/ttt.py's alignment).

        Step 0 row r: (fc(h_r), x_{r+1}, position r); step k >= 1 row r: (fc(mask_hidden),
        mask_token_id, position r+k). E.g. x = [a b c d], 3 steps, row 1: (h_b, c) at 1 -> d,
        then (mask, mask) at 2 and 3 -> x_4, x_5: vLLM's pass [.., c, mask, mask] after b.
        `scheme` "specforge" keeps every step at position r and hides step 0's rows
        r-k+1..r from step k, as ttt.unroll does for that scheme."""
        b, t = input_ids.shape
        caches = self.new_caches(scheme)
        rows = torch.arange(t, device=input_ids.device)
        mask_ids = torch.full_like(input_ids, self.config.mask_token_id)
        next_ids = torch.cat([input_ids[:, 1:], input_ids.new_zeros(b, min(1, t))], dim=1)
        outputs = []
        for k in range(steps):
            positions = rows + (k if scheme == "inference" else 0)
            if k == 0:
                out = call(next_ids, hidden, positions, cache=caches)
            else:
                out = call(mask_ids, None, positions, cache=caches)
            outputs.append(out)
        return outputs
