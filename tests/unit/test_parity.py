"""Parity's tolerance follows the stored and the engine's dtypes, and its message never
contradicts itself (the same slots named as 'fed' and as 'trained' with a fix of ids)."""
import torch

from eyas.layout import HiddenStateLayout, TargetIdentity
from eyas.serve.run import FLOAT32_AGREEMENT, judge_parity, parity_tolerance

TARGET = TargetIdentity("LlamaForCausalLM", 4, 64)
TRAINED = HiddenStateLayout.from_names(TARGET, ["block_out:0", "block_out:1", "block_out:2"])


def _relative(a, b):
    return float((a - b).norm() / b.norm())


def test_bf16_storage_passes_and_a_neighbouring_block_does_not():
    torch.manual_seed(0)
    state = torch.randn(256, 64) * 30  # a residual stream's scale
    stored = state.bfloat16().float()  # what a bf16 extraction keeps of it
    rounding = _relative(stored, state)
    assert rounding > FLOAT32_AGREEMENT  # the old fixed tolerance failed every bf16 run
    assert rounding <= parity_tolerance(torch.bfloat16, torch.float32)
    next_block = state + 0.05 * state.norm(dim=-1, keepdim=True) / 8 * torch.randn(256, 64)
    assert _relative(next_block, stored) > parity_tolerance(torch.bfloat16, torch.float32)


def test_tolerance_grows_with_lower_precision():
    f32 = parity_tolerance(torch.float32, torch.float32)
    assert f32 < 1.01e-3
    assert f32 < parity_tolerance(torch.float16, torch.float32) \
        < parity_tolerance(torch.bfloat16, torch.float32) \
        < parity_tolerance(torch.bfloat16, torch.bfloat16)


def test_same_slots_with_other_values_is_not_a_layout_fault():
    ok, message = judge_parity("vllm", TRAINED, TRAINED, TRAINED.names, 2e-2, 4.9e-3,
                               "bfloat16 stored, float32 in the engine")
    assert not ok
    assert "feeds the slots the draft was trained on" in message and "2.0e-02" in message
    assert "compile the layout" not in message and "the engine feeds [" not in message


def test_other_slots_name_both_sides_and_the_ids():
    shifted = HiddenStateLayout.from_names(TARGET, ["block_out:1", "block_out:2", "block_out:3"])
    ok, message = judge_parity("vllm", TRAINED, shifted, shifted.names, 0.0, 1e-3, "float32")
    assert not ok
    assert "feeds [block 1, block 2, block 3]; the draft was trained on [block 0, block 1, " \
           "block 2]" in message and "[1, 2, 3]" in message


def test_within_tolerance_is_ok():
    ok, message = judge_parity("vllm", TRAINED, TRAINED, TRAINED.names, 1.7e-3, 4.9e-3, "bf16")
    assert ok and message.startswith("parity: vllm feeds the draft [block 0, block 1, block 2]")
