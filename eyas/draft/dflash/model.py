"""The DFlash draft, with the module names and maths of vLLM's `DFlashQwen3ForCausalLM`
(model_executor/models/qwen3_dflash.py; the names: eyas.conventions.vllm_dflash).

One drafting step, as vLLM computes it for a context of n target positions and the bonus
token b (the target's own next token, at position n):

    context  c_p = hidden_norm(fc(cat(slots_p)))                  p = 0..n-1   [n, H]
             each layer's keys/values of the context: k_norm(k_proj(c)) with RoPE at p,
             v_proj(c): the same c for every layer, no input_layernorm
    block    the embeddings of [b, mask, ..., mask] (K+1 tokens) at positions n..n+K, through
             Qwen3 decoder layers (q_norm/k_norm, RoPE) whose attention is NON-causal over
             [context ; block]
    logits   lm_head(norm(.)) at block positions 1..K: position j drafts the token at n+j

In eyas's alignment (eyas/draft/ttt.py: draft position k of row r predicts x_{r+k+2})
every row r is an anchor: context rows 0..r, bonus x_{r+1} at position r+1, block position
j = k+1 at r+1+j. `forward` computes every anchor of a sequence in one pass: the context
keys/values once, each anchor's block attending the context rows <= r and its own block (the
dense [T*(K+1), T + T*(K+1)] mask, factored into a causal context part and a per-anchor
block part, so no cross-anchor block scores are computed). The TTT loss, the accuracies and
predicted tau (chain acceptance) then read these K positions like EAGLE-3's K steps.

The objective: DFlash's reference (the paper's Eq. 4; SpecForge's `loss_decay_gamma`) weighs
block position j >= 1 by exp(-(j-1)/gamma), gamma 7 for blocks of 16, 5 for 10, 4 for 8. That
is eyas's per-position weight decay**k with decay = exp(-1/gamma), k = j-1
(train.step_loss_decay): its default 0.8 is gamma 4.5, the reference's range for the small
blocks served here. The reference divides the weighted sum by the count of every scored
position of the batch, all block positions together, where a chain draft's loss is a mean per
position: the family pools them (Family.pooled_loss, eyas.draft.ttt.pooled). With that,
speculators' own DFlashDraftModel gives the same loss and gradients on the same weights,
batch and anchors (tests/unit/test_dflash_objective.py).

The token embedding is the target's, frozen and not saved (vLLM shares it), so the draft's
hidden size is the target's. The mask token is one of the target's ids
(eyas.draft.vocab.choose_mask_token).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, rotate_half

from eyas.draft.eagle3.model import DraftMLP, sizes_from_target
from eyas.draft.vocab import DraftVocab, SharesTargetVocab
from eyas.nn import RMSNorm


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    num_aux_hidden_states: int  # slots concatenated into fc (the layout's draft inputs)
    num_hidden_layers: int
    mask_token_id: int  # a target id: its (the target's) embedding fills the block's masks
    block_size: int  # bonus + masks; served with num_speculative_tokens = block_size - 1
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default",
                                                           "rope_theta": 10000.0})
    hidden_act: str = "silu"

    @classmethod
    def from_target(cls, target_config, num_slots: int, draft_vocab_size: int,
                    mask_token_id: int, block_size: int, num_layers: int = 1,
                    **overrides) -> "DFlashConfig":
        """Hyper-parameters as the target's (an HF config), unless overridden."""
        hidden = target_config.hidden_size
        base = cls(**sizes_from_target(target_config), draft_vocab_size=draft_vocab_size,
                   num_aux_hidden_states=num_slots, num_hidden_layers=num_layers,
                   mask_token_id=int(mask_token_id), block_size=block_size)
        config = replace(base, **overrides)
        if config.hidden_size != hidden:
            raise ValueError(
                f"draft hidden_size {config.hidden_size} differs from the target's {hidden}: "
                "vLLM feeds a DFlash draft the target's token embedding (the checkpoint carries "
                "none), so the widths must match")
        if "head_dim" not in overrides and "num_attention_heads" in overrides:
            config = replace(config, head_dim=hidden // config.num_attention_heads)
        if config.block_size < 2:
            raise ValueError(f"block_size {config.block_size}: a DFlash block is the bonus "
                             "token and at least one mask")
        return config

    def hf_config(self) -> LlamaConfig:
        """A LlamaConfig with these numbers: the RoPE implementation takes one."""
        return LlamaConfig(hidden_size=self.hidden_size,
                           num_attention_heads=self.num_attention_heads,
                           head_dim=self.head_dim, rope_parameters=dict(self.rope_parameters),
                           max_position_embeddings=self.max_position_embeddings)


def _rope(x, cos, sin):
    """x [..., heads, d]; cos, sin [..., d] (HF's rotate-half form = vLLM's neox style)."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return x * cos + rotate_half(x) * sin


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                    cfg.num_key_value_heads, cfg.head_dim)
        h = cfg.hidden_size  # input width H (EAGLE-3's layer takes 2H)
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def context_kv(self, context, cos, sin):
        """context [B, T, H] (already hidden_norm'ed) -> keys, values [B, T, kv, d]."""
        b, t, _ = context.shape
        k = self.k_norm(self.k_proj(context).view(b, t, self.kv_heads, self.head_dim))
        v = self.v_proj(context).view(b, t, self.kv_heads, self.head_dim)
        return _rope(k, cos, sin), v

    def forward(self, x, cos, sin, context_kv, visible):
        """x [B, A, S, H]: anchor a's block of S tokens; cos/sin [B, A, S, d]; context_kv
        ([B, T, kv, d] x2); visible bool, broadcast to [B, 1, A, 1, T]: anchor a sees context
        row c."""
        b, t, s, _ = x.shape
        q = _rope(self.q_norm(self.q_proj(x).view(b, t, s, self.heads, self.head_dim)),
                  cos, sin)
        k = _rope(self.k_norm(self.k_proj(x).view(b, t, s, self.kv_heads, self.head_dim)),
                  cos, sin)
        v = self.v_proj(x).view(b, t, s, self.kv_heads, self.head_dim)
        rep = self.heads // self.kv_heads
        kc, vc = (z.repeat_interleave(rep, dim=-2) for z in context_kv)  # [B, T, h, d]
        k, v = k.repeat_interleave(rep, dim=-2), v.repeat_interleave(rep, dim=-2)
        scale = self.head_dim ** -0.5
        to_context = torch.einsum("brshd,bchd->bhrsc", q, kc) * scale  # [B, h, T, S, T]
        to_context = to_context.masked_fill(~visible, float("-inf"))
        to_block = torch.einsum("brshd,bruhd->bhrsu", q, k) * scale  # [B, h, T, S, S]
        weights = torch.cat([to_context, to_block], -1).float().softmax(-1).to(q.dtype)
        n = kc.shape[1]  # context rows
        out = (torch.einsum("bhrsc,bchd->brshd", weights[..., :n], vc)
               + torch.einsum("bhrsu,bruhd->brshd", weights[..., n:], v))
        return self.o_proj(out.reshape(b, t, s, self.heads * self.head_dim))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.mlp = DraftMLP(cfg)  # Qwen3's MLP is Llama's: silu(gate) * up -> down

    def forward(self, x, cos, sin, context_kv, visible):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context_kv, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(SharesTargetVocab, nn.Module):
    # the block's first slot that drafts: DFlash's slot 0 holds the bonus token and drafts
    # nothing, so a block of B drafts B-1 tokens (DSpark's anchor slot drafts too: 0)
    first_slot = 1

    def __init__(self, config: DFlashConfig, target_embedding: torch.Tensor | nn.Embedding,
                 vocab: DraftVocab):
        super().__init__()
        if not 0 <= config.mask_token_id < config.vocab_size:
            raise ValueError(f"mask_token_id {config.mask_token_id} is not a target id "
                             f"(0..{config.vocab_size - 1}): vLLM embeds the masks with the "
                             "target's embedding")
        self.config = config
        self.share_target_vocab(config, target_embedding, vocab)  # embed_tokens, d2t, t2d
        self.fc = nn.Linear(config.num_aux_hidden_states * config.target_hidden_size,
                            config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config.hf_config())  # buffers not persistent

    @property
    def drafts(self) -> int:
        """Tokens drafted per block, all in one pass (vLLM's num_speculative_tokens)."""
        return self.config.block_size - self.first_slot

    def context(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., n_slots*H_target] -> [..., H]: what each layer's keys/values read."""
        return self.hidden_norm(self.fc(hidden))

    def forward(self, input_ids, hidden, anchors=None):
        """input_ids [B, T] (the target's tokens), hidden [B, T, n_slots*H_target] (the
        layout's draft inputs) -> (states [B, T, K, H], logits [B, T, K, draft_vocab]) (what
        `heads` gives), K = `drafts` (block_size - 1): [r, k] drafts token r+k+2 from context
        rows 0..r and bonus x_{r+1} (rows whose bonus is past the end read token 0 and are
        never scored).

        `anchors` [B, T] bool (training's sampled anchors, train.anchors): only those rows'
        blocks are computed, the other rows' outputs are 0 (and never scored)."""
        if hidden.shape[-1] != self.fc.in_features:
            raise ValueError(f"hidden has width {hidden.shape[-1]}, expected "
                             f"{self.config.num_aux_hidden_states} concatenated slots of "
                             f"{self.config.target_hidden_size} = {self.fc.in_features}")
        b, t = input_ids.shape
        s, device = self.config.block_size, input_ids.device
        rows = torch.arange(t, device=device)
        if anchors is None:
            at_rows, kept = rows.expand(b, -1), None  # every row is an anchor: [B, A = T]
        else:  # each sample's anchors first, padded with its other rows (computed, dropped)
            count = int(anchors.sum(1).max())
            at_rows = anchors.to(torch.int8).argsort(dim=1, descending=True, stable=True)[:, :count]
            kept = anchors.gather(1, at_rows)  # [B, A]: a real anchor, not padding
        a = at_rows.shape[1]
        # E.g. x = [a b c d], K = 2: anchor 1's block is [c, M, M] at positions 2, 3, 4
        bonus = torch.cat([input_ids[:, 1:], input_ids.new_zeros(b, 1)], 1)  # x_{r+1}
        block = bonus.gather(1, at_rows)[:, :, None].repeat(1, 1, s)
        block[:, :, 1:] = self.config.mask_token_id  # [B, A, S]
        context = self.context(hidden)  # [B, T, H]
        x = self.embed_tokens(block).to(context.dtype)  # [B, A, S, H]
        cos_c, sin_c = self.rotary_emb(context, rows.expand(b, -1))  # [B, T, d]
        at = (at_rows[:, :, None] + 1 + torch.arange(s, device=device)).reshape(b, -1)
        cos, sin = (z.view(b, a, s, -1) for z in self.rotary_emb(context, at))
        # [B, 1, A (anchor), 1, T (context row)]: anchor r sees context rows <= r
        visible = (rows[None, None, :] <= at_rows[:, :, None])[:, None, :, None, :]
        for layer in self.layers:
            kv = layer.self_attn.context_kv(context, cos_c, sin_c)
            x = layer(x, cos, sin, kv, visible)
        normed = self.norm(x[:, :, self.first_slot:])  # [B, A, K, H]: the masks, not the bonus
        outputs = self.heads(normed, input_ids, at_rows)
        if kept is None:
            return outputs
        where = (torch.arange(b, device=device)[:, None].expand(-1, a)[kept], at_rows[kept])
        full = []
        for out in outputs:  # each anchor's rows in place, the other rows 0
            rows = out.new_zeros(b, t, *out.shape[2:])
            rows[where] = out[kept]
            full.append(rows)
        return tuple(full)

    def heads(self, normed, input_ids, at_rows):
        """The drafting slots' final-normed states [B, A, K, H] -> what forward returns per
        anchor: (states, logits [B, A, K, draft_vocab]). `input_ids` [B, T] and `at_rows`
        [B, A] (each anchor's row) are for a family whose heads read the block's tokens."""
        return normed, self.lm_head(normed)

    def draft_steps(self, call, input_ids, hidden, steps: int, scheme: str = "inference",
                    anchors=None):
        """The seam's per-position outputs (eyas.draft.families): [(state, logits)] for draft
        positions 0..K-1. `scheme` changes nothing: SpecForge's DFlash training (context rows
        before the anchor, the anchor's token first in its block) is this same alignment."""
        if steps > self.drafts:
            raise ValueError(
                f"{steps} draft positions for a draft trained on blocks of "
                f"{self.config.block_size}: it drafts {self.drafts} tokens at most, all in "
                f"one pass (vLLM: num_speculative_tokens={self.drafts})")
        # the whole block always: its masks attend to each other, so fewer positions are the
        # first ones of the block the draft was trained (and is served) on
        states, logits = call(input_ids, hidden, anchors)
        return [(states[:, :, k], logits[:, :, k]) for k in range(steps)]
