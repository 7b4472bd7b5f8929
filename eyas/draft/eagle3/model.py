"""The EAGLE-3 draft, with the module names and maths of vLLM's `LlamaForCausalLMEagle3`.

    fc:       [B, T, n_slots*H_target] -> [B, T, H]   the target's slots, concatenated
    midlayer: one Llama decoder layer whose attention reads cat([input_layernorm(embeds),
              hidden_norm(h)]) (2H wide, embeddings first); the residual is h itself
    norm, lm_head: [B, T, H] -> [B, T, draft_vocab]

as in vLLM's llama_eagle3.py, with its four normalisation options (all off by default):
    norm_before_fc:       fc(input_norm(cat(slots)))      one RMSNorm over the n_slots*H input
    fc_norm:              fc(cat(fc_norm[i](slot_i)))     one RMSNorm per slot
    norm_before_residual: residual = hidden_norm(h)       (off: residual = h itself)
    norm_output:          the next step takes norm(prenorm)  (off: prenorm)
    residual = h;  h = residual + attn(cat(...));  prenorm = h + mlp(post_attention_layernorm(h))
What the next speculative step takes as its `h` (without fc) is `forward`'s first output.

Parameter names are exactly the checkpoint's (`fc.weight`, `midlayer.self_attn.q_proj.weight`,
...; `eyas.conventions.vllm_checkpoint.draft_weight_shapes` lists them), so saving needs no
renaming. The token embedding is the target's, frozen: vLLM shares the target's embedding, so
it is not saved, and that is also why the draft's hidden size must equal the target's.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from eyas.draft.attention import TTTCache, extend_attention
from eyas.draft.eagle3.mla import MLAAttention
from eyas.draft.vocab import DraftVocab, SharesTargetVocab
from eyas.conventions.vllm_checkpoint import rope_parameters
from eyas.nn import RMSNorm


def sizes_from_target(target_config) -> dict:
    """A draft's sizes as the target's (an HF config), the fields every family's config
    shares: its width (the target's, since the draft reads the target's embedding), heads,
    FFN, norm epsilon, positions, vocabulary, RoPE and activation."""
    heads, hidden = target_config.num_attention_heads, target_config.hidden_size
    return dict(
        hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(target_config, "head_dim", None) or hidden // heads,
        intermediate_size=target_config.intermediate_size,
        rms_norm_eps=target_config.rms_norm_eps,
        max_position_embeddings=target_config.max_position_embeddings,
        vocab_size=target_config.vocab_size, target_hidden_size=hidden,
        rope_parameters=rope_parameters(target_config),
        hidden_act=getattr(target_config, "hidden_act", "silu"))


@dataclass(frozen=True)
class Eagle3Config:
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
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default",
                                                           "rope_theta": 10000.0})
    hidden_act: str = "silu"
    # vLLM's llama_eagle3 options (eyas.conventions.vllm_checkpoint.NORM_OPTIONS writes and reads them)
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_before_residual: bool = False
    norm_output: bool = False
    # multi-head latent attention (DeepSeek/Kimi drafts, eyas/draft/eagle3/mla.py): the ranks and head
    # dims of vllm_checkpoint.MLA_KEYS; None: Llama attention. head_dim is then the RoPE part's
    mla: dict | None = None

    @classmethod
    def from_target(cls, target_config, num_slots: int, draft_vocab_size: int,
                    **overrides) -> "Eagle3Config":
        """Hyper-parameters as the target's (an HF config), unless overridden."""
        hidden = target_config.hidden_size
        base = cls(**sizes_from_target(target_config), draft_vocab_size=draft_vocab_size,
                   num_aux_hidden_states=num_slots)
        config = replace(base, **overrides)
        if config.hidden_size != hidden:
            raise ValueError(
                f"draft hidden_size {config.hidden_size} differs from the target's {hidden}: "
                "vLLM feeds the draft the target's token embedding (the checkpoint carries none), "
                "so the widths must match")
        return config

    def hf_config(self) -> LlamaConfig:
        """A LlamaConfig with these numbers: the RoPE implementation takes one."""
        return LlamaConfig(
            hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate_size, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings, vocab_size=self.vocab_size,
            rope_parameters=dict(self.rope_parameters), num_hidden_layers=1,
            hidden_act=self.hidden_act)


class DraftAttention(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                    cfg.num_key_value_heads, cfg.head_dim)
        width = 2 * cfg.hidden_size  # [norm(embeds), norm(hidden)]
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, cache: TTTCache | None = None):
        b, t, _ = x.shape  # x: [B, T, 2H]
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)  # q: [B, heads, T, d]; k, v: [B, kv, T, d]
        if not cache:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 enable_gqa=self.heads != self.kv_heads)
        else:
            out = self._extend(q, cache + [(k, v)], getattr(cache, "hide_recent", False))
        if cache is not None:
            cache.append((k, v))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))

    def _extend(self, q, steps, hide_recent: bool = False):
        return extend_attention(q, steps, self.heads // self.kv_heads, self.head_dim ** -0.5,
                                hide_recent)


class DraftMLP(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r}: only silu (Llama/Qwen) is built")
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAAttention(cfg) if cfg.mla else DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)

    def forward(self, embeds, hidden, cos, sin, cache=None):
        normed = self.hidden_norm(hidden)
        # the hidden side carries the residual stream, as in vLLM: raw, or normalised first
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        hidden = residual + self.self_attn(x, cos, sin, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))  # pre-norm [B, T, H]


class Eagle3Draft(SharesTargetVocab, nn.Module):
    def __init__(self, config: Eagle3Config, target_embedding: torch.Tensor | nn.Embedding,
                 vocab: DraftVocab):
        super().__init__()
        self.config = config
        self.share_target_vocab(config, target_embedding, vocab)  # embed_tokens, d2t, t2d
        width = config.num_aux_hidden_states * config.target_hidden_size
        self.input_norm = RMSNorm(width, config.rms_norm_eps) if config.norm_before_fc else None
        self.fc_norm = nn.ModuleList(
            RMSNorm(config.target_hidden_size, config.rms_norm_eps)
            for _ in range(config.num_aux_hidden_states)) if config.fc_norm else None
        self.fc = nn.Linear(width, config.hidden_size, bias=False)
        self.midlayer = DraftLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config.hf_config())  # buffers not persistent

    def project(self, slots: torch.Tensor) -> torch.Tensor:
        """[..., n_slots*H_target] -> [..., H]: the optional norms, then fc (vLLM's
        `combine_hidden_states`: input_norm first, then the per-slot fc_norm)."""
        if self.input_norm is not None:
            slots = self.input_norm(slots)
        if self.fc_norm is not None:
            chunks = slots.chunk(len(self.fc_norm), dim=-1)
            slots = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(slots)

    def inputs(self, token_ids, hidden, positions=None, projected: bool = False):
        """(hidden [B, T, H] after fc, token embeddings [B, T, H], RoPE cos, sin) for
        `forward`: the width checked, the slots projected unless already, positions 0..T-1
        unless given."""
        want = self.config.hidden_size if projected else self.fc.in_features
        if hidden.shape[-1] != want:
            kind = "projected hidden" if projected else (
                f"{self.config.num_aux_hidden_states} concatenated slots of "
                f"{self.config.target_hidden_size}")
            raise ValueError(f"hidden has width {hidden.shape[-1]}, expected {want} ({kind})")
        if not projected:
            hidden = self.project(hidden)  # [B, T, H]
        if positions is None:
            positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        positions = positions.expand(token_ids.shape[0], -1)  # [B, T]
        embeds = self.embed_tokens(token_ids).to(hidden.dtype)  # [B, T, H]
        cos, sin = self.rotary_emb(hidden, positions)  # [B, T, head_dim]
        return hidden, embeds, cos, sin

    def forward(self, token_ids, hidden, positions=None, *, projected: bool = False,
                cache: TTTCache | None = None):
        """token_ids [B, T]; hidden [B, T, n_slots*H_target] (or [B, T, H] if `projected`).

        Returns (next_hidden [B, T, H], logits [B, T, draft_vocab]): next_hidden is what the
        next speculative step takes (the pre-norm output; its normed value with norm_output).
        `positions` [B, T] or [T] default to 0..T-1. With `cache`, this call is one TTT step
        (see eyas/draft/ttt.py).
        """
        hidden, embeds, cos, sin = self.inputs(token_ids, hidden, positions, projected)
        prenorm = self.midlayer(embeds, hidden, cos, sin, cache)
        normed = self.norm(prenorm)
        return (normed if self.config.norm_output else prenorm), self.lm_head(normed)
