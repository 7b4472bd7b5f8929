"""The EAGLE-3 draft model and its vLLM checkpoint: names, shapes, maths, config, round trip."""
from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from eyas.draft.checkpoint import LAYOUT_KEY, load_draft, read_config, save_draft
from eyas.draft.model import Eagle3Config
from eyas.draft.vocab import build_vocab
from eyas.engines import vllm_checkpoint
from eyas.layout import HiddenStateLayout, LayoutError
from helpers import tiny_setup

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def tiny():
    return tiny_setup()


# The tensor list of docs/engines.md ("The draft checkpoint vLLM loads"), with this draft's numbers:
# H=32, heads 4 x head_dim 8, kv heads 2, I=64, 3 slots, draft vocab 64, vocab 96.
VLLM_TENSORS = {
    "fc.weight": (32, 96),
    "midlayer.hidden_norm.weight": (32,),
    "midlayer.input_layernorm.weight": (32,),
    "midlayer.post_attention_layernorm.weight": (32,),
    "midlayer.self_attn.q_proj.weight": (32, 64),
    "midlayer.self_attn.k_proj.weight": (16, 64),
    "midlayer.self_attn.v_proj.weight": (16, 64),
    "midlayer.self_attn.o_proj.weight": (32, 32),
    "midlayer.mlp.gate_proj.weight": (64, 32),
    "midlayer.mlp.up_proj.weight": (64, 32),
    "midlayer.mlp.down_proj.weight": (32, 64),
    "norm.weight": (32,),
    "lm_head.weight": (64, 32),
    "d2t": (64,),
    "t2d": (96,),
}


def test_config_from_target_takes_the_targets_numbers(tiny):
    c = tiny.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.target_hidden_size, c.num_aux_hidden_states) == \
        (32, 4, 2, 8, 64, 32, 3)
    assert c.rope_parameters["rope_theta"] == 5000.0 and c.vocab_size == 96
    assert Eagle3Config.from_target(tiny.cfg, 3, 64, intermediate_size=128).intermediate_size == 128
    with pytest.raises(ValueError, match="hidden_size 64 differs from the target's 32"):
        Eagle3Config.from_target(tiny.cfg, 3, 64, hidden_size=64)
    # every field is written into a draft's config, but `mla`: eyas reads MLA drafts (their
    # keys are vllm_checkpoint.MLA_KEYS) and trains Llama ones
    assert {f.name for f in fields(Eagle3Config)} == set(vllm_checkpoint.DRAFT_HYPER_KEYS) | set(
        vllm_checkpoint.NORM_OPTIONS) | {"mla"}


def test_weight_names_and_shapes_are_vllms(tiny):
    state = {k: tuple(v.shape) for k, v in tiny.draft.state_dict().items()}
    assert state.pop("embed_tokens.weight") == (96, 32)
    assert state == VLLM_TENSORS
    assert vllm_checkpoint.draft_weight_shapes(vars(tiny.config)) == VLLM_TENSORS
    trainable = {n for n, p in tiny.draft.named_parameters() if p.requires_grad}
    assert "embed_tokens.weight" not in trainable and "fc.weight" in trainable
    assert tiny.draft.embed_tokens.weight.data_ptr() == tiny.embed.weight.data_ptr()  # shared


def test_forward_shapes_and_width_checks(tiny):
    ids, hidden = tiny.ids[:2], tiny.hidden[:2]
    prenorm, logits = tiny.draft(ids, hidden)
    assert prenorm.shape == (2, 24, 32) and logits.shape == (2, 24, 64)
    again, _ = tiny.draft(ids, tiny.draft.fc(hidden), projected=True)
    torch.testing.assert_close(again, prenorm, rtol=0, atol=0)
    with pytest.raises(ValueError, match="width 32, expected 96"):
        tiny.draft(ids, hidden[..., :32])


def _rms(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _with_options(tiny, **options):
    """The tiny draft rebuilt with norm options on, its norm weights random (so a norm
    applied in the wrong place, or not at all, changes the numbers)."""
    from dataclasses import replace

    from eyas.draft.model import Eagle3Draft
    torch.manual_seed(1)
    d = Eagle3Draft(replace(tiny.config, **options), tiny.embed, tiny.vocab)
    d.load_state_dict(tiny.draft.state_dict(), strict=False)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight") or ".weight" in name and "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    return d


OPTION_CASES = [{}, {"norm_before_fc": True}, {"fc_norm": True},
                {"norm_before_residual": True}, {"norm_output": True},
                {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True}]


@pytest.mark.parametrize("options", OPTION_CASES, ids=lambda o: "+".join(o) or "none")
def test_forward_is_vllms_llama_eagle3_maths(tiny, options):
    """Recompute from the raw tensors what vLLM's llama_eagle3 computes (embeds first;
    residual = fc out, or hidden_norm(fc out) with norm_before_residual; input_norm then the
    per-slot fc_norm before fc; the post-norm state fed back with norm_output)."""
    d = _with_options(tiny, **options) if options else tiny.draft
    w, eps = d.state_dict(), tiny.config.rms_norm_eps
    ids, hidden = tiny.ids[:1, :10], tiny.hidden[:1, :10]
    if options.get("norm_before_fc"):
        hidden = _rms(hidden, w["input_norm.weight"], eps)
    if options.get("fc_norm"):
        hidden = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"], eps)
                            for i, c in enumerate(hidden.chunk(3, dim=-1))], dim=-1)
    h = hidden @ w["fc.weight"].T  # [1, 10, 32]
    normed_h = _rms(h, w["midlayer.hidden_norm.weight"], eps)
    x = torch.cat([_rms(tiny.embed.weight[ids], w["midlayer.input_layernorm.weight"], eps),
                   normed_h], dim=-1)  # [1, 10, 64]
    if options.get("norm_before_residual"):
        h = normed_h
    a = "midlayer.self_attn."
    q = (x @ w[a + "q_proj.weight"].T).view(1, 10, 4, 8).transpose(1, 2)
    k = (x @ w[a + "k_proj.weight"].T).view(1, 10, 2, 8).transpose(1, 2)
    v = (x @ w[a + "v_proj.weight"].T).view(1, 10, 2, 8).transpose(1, 2)
    inv = 1.0 / 5000.0 ** (torch.arange(0, 8, 2).float() / 8)
    ang = torch.arange(10).float()[:, None] * inv
    emb = torch.cat([ang, ang], -1)[None]
    q, k = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    scores = scores.masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 10, 32) @ w[a + "o_proj.weight"].T
    h = h + attn
    m = _rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
    m = (torch.nn.functional.silu(m @ w["midlayer.mlp.gate_proj.weight"].T)
         * (m @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
    prenorm = h + m
    normed = _rms(prenorm, w["norm.weight"], eps)
    logits = normed @ w["lm_head.weight"].T
    got_fed_back, got_logits = d(ids, tiny.hidden[:1, :10])
    want_fed_back = normed if options.get("norm_output") else prenorm
    torch.testing.assert_close(got_fed_back, want_fed_back, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_logits, logits, rtol=1e-5, atol=1e-5)


