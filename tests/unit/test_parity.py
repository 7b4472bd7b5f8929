"""Parity's tolerance follows the stored and the engine's dtypes, and the doctor's wording of
what an engine feeds never contradicts itself (the same slots named as 'fed' and as
'trained' with a fix of ids)."""
import torch

from eyas.doctor.checks import fed_slots_finding
from eyas.doctor.fingerprints import FLOAT32_AGREEMENT, parity_tolerance, token_relative_error
from eyas.layout import HiddenStateLayout, TargetIdentity

TARGET = TargetIdentity("LlamaForCausalLM", 4, 64)
TRAINED = HiddenStateLayout.from_names(TARGET, ["block_out:0", "block_out:1", "block_out:2"])


def _relative(a, b):
    return float((a - b).norm() / b.norm())


def test_bf16_storage_passes_and_a_neighbouring_block_does_not():
    torch.manual_seed(0)
    state = torch.randn(256, 64) * 30  # a residual stream's scale
    stored = state.bfloat16().float()  # what a bf16 extraction keeps of it
    rounding = token_relative_error(stored, state)
    assert rounding > FLOAT32_AGREEMENT  # a float32-only tolerance fails every bf16 run
    assert rounding <= parity_tolerance(torch.bfloat16, torch.float32)
    next_block = state + 0.05 * state.norm(dim=-1, keepdim=True) / 8 * torch.randn(256, 64)
    assert token_relative_error(next_block, stored) > parity_tolerance(torch.bfloat16,
                                                                       torch.float32)


def test_a_massive_activation_token_does_not_hide_a_neighbouring_block():
    """A pretrained target's few huge tokens (SmolLM2: norm ~25,000 at every middle block,
    the rest ~170) barely change between blocks: over the whole tensor a neighbouring block is
    within bf16's tolerance 27 blocks deep, token by token it is far outside."""
    torch.manual_seed(0)
    block = torch.randn(64, 576) * 170 / 24
    block[0] = torch.randn(576) * 25_000 / 24  # the attention-sink token
    neighbour = block + torch.randn(64, 576) * 0.25 * 170 / 24
    neighbour[0] = block[0] * 1.0005
    tolerance = parity_tolerance(torch.bfloat16, torch.bfloat16, depth=27,
                                 extracted=torch.bfloat16)
    assert _relative(neighbour, block) < tolerance  # what the whole-tensor error could not see
    assert token_relative_error(neighbour, block) > 2 * tolerance


def test_tolerance_grows_with_depth_and_lower_precision():
    f32 = parity_tolerance(torch.float32, torch.float32)
    assert f32 < 3.01e-3
    assert f32 < parity_tolerance(torch.float16, torch.float32) \
        < parity_tolerance(torch.bfloat16, torch.float32) \
        < parity_tolerance(torch.bfloat16, torch.bfloat16) \
        < parity_tolerance(torch.bfloat16, torch.bfloat16, extracted=torch.bfloat16) \
        < parity_tolerance(torch.bfloat16, torch.bfloat16, depth=27, extracted=torch.bfloat16)
    # float32 rounds too little to walk: depth changes nothing there
    assert parity_tolerance(torch.float32, torch.float32, depth=30) == f32


def test_same_slots_with_other_values_is_not_a_layout_fault():
    finding = fed_slots_finding(TRAINED, TRAINED, TRAINED.names, 2e-2, 4.9e-3,
                                "bfloat16 stored, float32 in the engine")
    assert finding.name == "values_differ"
    assert "feeds the slots the draft was trained on" in finding.message
    assert "2.0e-02" in finding.message
    assert "compile the layout" not in finding.message
    assert "the engine feeds [" not in finding.message


def test_other_slots_name_both_sides_and_the_ids():
    shifted = HiddenStateLayout.from_names(TARGET, ["block_out:1", "block_out:2", "block_out:3"])
    finding = fed_slots_finding(TRAINED, shifted, shifted.names, 0.0, 1e-3, "float32")
    assert finding.name == "shifted"
    assert "feeds [block 1, block 2, block 3]; the draft was trained on [block 0, block 1, " \
           "block 2]" in finding.message and "[1, 2, 3]" in finding.message


def test_within_tolerance_is_no_finding():
    assert fed_slots_finding(TRAINED, TRAINED, TRAINED.names, 1.7e-3, 4.9e-3, "bf16") is None
    assert fed_slots_finding(TRAINED, TRAINED, TRAINED.names, 0.5) is None  # no tolerance given
