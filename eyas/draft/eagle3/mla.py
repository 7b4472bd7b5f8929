"""Multi-head latent attention (DeepSeek-V2/V3, Kimi) for an EAGLE-3 draft, as vLLM's
`deepseek_eagle3.py` builds its one layer: `DeepseekV2MLAAttention` reading the 2H-wide
cat([input_layernorm(embeds), hidden_norm(h)]) (the rest of the layer is the Llama draft's).

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))   (or q_proj(x) without q_lora_rank)
             per head [qk_nope_head_dim | qk_rope_head_dim]
    latent = kv_a_proj_with_mqa(x) = [kv_lora_rank | qk_rope_head_dim]
    k, v   = kv_b_proj(kv_a_layernorm(latent[:kv_lora_rank])): per head [nope | v_head_dim];
             the rope part of k (latent[kv_lora_rank:]) is one for all heads
    RoPE on the rope parts only, pairs interleaved (vLLM: is_neox_style=False); softmax scale
    qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) ** 2 under DeepSeek's YaRN.

Keys and values enter the training-time-test cache like the Llama draft's (heads = kv heads),
so eyas/draft/ttt.py and the evaluator run it unchanged.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from eyas.draft.attention import extend_attention
from eyas.nn import RMSNorm


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(qk_head_dim: int, rope: dict) -> float:
    scale = qk_head_dim ** -0.5
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        scale *= yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"])) ** 2
    return scale


def rotate_interleaved(x, cos, sin):
    """RoPE on pairs (x0, x1), (x2, x3), ... (GPT-J style); cos/sin are [B, T, d] as HF's
    rotary embedding gives them (each frequency twice, halves concatenated)."""
    cos = cos[..., : cos.shape[-1] // 2].unsqueeze(1)
    sin = sin[..., : sin.shape[-1] // 2].unsqueeze(1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    # de-interleaved output order: the same for q and k, so every dot product is unchanged
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class MLAAttention(nn.Module):
    def __init__(self, cfg, input_size: int | None = None):
        super().__init__()
        m = cfg.mla
        self.heads = self.kv_heads = cfg.num_attention_heads
        self.nope, self.rope, self.v_dim = (m["qk_nope_head_dim"], m["qk_rope_head_dim"],
                                            m["v_head_dim"])
        self.kv_rank, self.q_rank = m["kv_lora_rank"], m.get("q_lora_rank")
        width = input_size or 2 * cfg.hidden_size  # [norm(embeds), norm(hidden)]
        qk = self.nope + self.rope
        if self.q_rank:
            self.q_a_proj = nn.Linear(width, self.q_rank, bias=False)
            self.q_a_layernorm = RMSNorm(self.q_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(self.q_rank, self.heads * qk, bias=False)
        else:
            self.q_proj = nn.Linear(width, self.heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(width, self.kv_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_rank, self.heads * (self.nope + self.v_dim),
                                   bias=False)
        self.o_proj = nn.Linear(self.heads * self.v_dim, cfg.hidden_size, bias=False)
        self.scale = softmax_scale(qk, cfg.rope_parameters)

    def forward(self, x, cos, sin, cache=None):
        b, t, _ = x.shape
        q = (self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_rank
             else self.q_proj(x))
        q = q.view(b, t, self.heads, self.nope + self.rope).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent))
        k_nope, v = kv.view(b, t, self.heads, self.nope + self.v_dim).transpose(1, 2).split(
            [self.nope, self.v_dim], dim=-1)
        q = torch.cat([q_nope, rotate_interleaved(q_rope, cos, sin)], dim=-1)
        k_rope = rotate_interleaved(k_rope.unsqueeze(1), cos, sin)  # one for every head
        k = torch.cat([k_nope, k_rope.expand(-1, self.heads, -1, -1)], dim=-1)
        if not cache:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            out = extend_attention(q, cache + [(k, v)], 1, self.scale,
                                   getattr(cache, "hide_recent", False))
        if cache is not None:
            cache.append((k, v))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.v_dim))
