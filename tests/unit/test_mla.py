"""An MLA (DeepSeek/Kimi) draft's attention is DeepSeek's: eyas's MLAAttention against
transformers' DeepseekV3Attention (the reference vLLM's DeepseekV2MLAAttention matches) with
the same weights, DeepSeek's YaRN and interleaved RoPE; and what each ingredient changes."""

import pytest
import torch
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3Attention,
                                                                  DeepseekV3RotaryEmbedding)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from eyas.draft.eagle3.mla import MLAAttention, softmax_scale
from eyas.draft.eagle3.model import Eagle3Config
from helpers import TINY_MLA, TINY_YARN

pytestmark = pytest.mark.usefixtures("one_thread")
H, HEADS = 32, 4


def _pair(rope=TINY_YARN, mla=TINY_MLA):
    torch.manual_seed(0)
    ref_cfg = DeepseekV3Config(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                               max_position_embeddings=128, rope_parameters=dict(rope),
                               rope_interleave=True, attention_bias=False, **mla)
    ref_cfg._attn_implementation = "sdpa"
    ref = DeepseekV3Attention(ref_cfg, 0).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    cfg = Eagle3Config(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                       head_dim=mla["qk_rope_head_dim"], intermediate_size=64,
                       rms_norm_eps=ref_cfg.rms_norm_eps, max_position_embeddings=128,
                       vocab_size=96, draft_vocab_size=64, target_hidden_size=H,
                       num_aux_hidden_states=3, rope_parameters=dict(rope), mla=dict(mla))
    mine = MLAAttention(cfg, input_size=H).eval()  # the reference reads H, the draft 2H
    mine.load_state_dict(ref.state_dict())
    return ref, DeepseekV3RotaryEmbedding(ref_cfg), mine, LlamaRotaryEmbedding(cfg.hf_config())


@pytest.mark.parametrize("rope", [TINY_YARN, {"rope_type": "default", "rope_theta": 5000.0}],
                         ids=["yarn", "default-rope"])
@pytest.mark.parametrize("q_lora_rank", [24, None], ids=["q-lora", "q-proj"])
def test_mla_attention_equals_deepseek_v3s(rope, q_lora_rank):
    ref, ref_rotary, mine, rotary = _pair(rope, {**TINY_MLA, "q_lora_rank": q_lora_rank})
    x = torch.randn(2, 40, H)  # past original_max_position_embeddings=32: YaRN matters
    positions = torch.arange(40)[None].expand(2, -1)
    with torch.no_grad():
        want, _ = ref(x, ref_rotary(x, positions), attention_mask=None)
        got = mine(x, *rotary(x, positions))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_each_ingredient_changes_the_output():
    """Without DeepSeek's mscale, or with half-split (neox) RoPE, the output differs: the
    equality above is not one a looser model also meets."""
    ref, ref_rotary, mine, rotary = _pair()
    x, positions = torch.randn(1, 40, H), torch.arange(40)[None]
    with torch.no_grad():
        want, _ = ref(x, ref_rotary(x, positions), attention_mask=None)
        cos, sin = rotary(x, positions)
        mine.scale = softmax_scale(12, {"rope_type": "default"})
        assert not torch.allclose(mine(x, cos, sin), want, atol=1e-3)
    assert softmax_scale(12, TINY_YARN) > softmax_scale(12, {"rope_type": "default"})
    ref2, ref_rotary2, mine2, rotary2 = _pair()
    import eyas.draft.eagle3.mla as mla

    def neox(t, c, s):
        c, s = c.unsqueeze(1), s.unsqueeze(1)
        half = t.shape[-1] // 2
        return t * c + torch.cat([-t[..., half:], t[..., :half]], -1) * s

    real = mla.rotate_interleaved
    mla.rotate_interleaved = neox
    try:
        with torch.no_grad():
            assert not torch.allclose(mine2(x, *rotary2(x, positions)), want, atol=1e-3)
    finally:
        mla.rotate_interleaved = real
