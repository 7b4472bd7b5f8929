"""SpecForge as a peer (bench/peer_recipe.py): its own draft, forward, loss and optimizer train
on eyas's batches, and the draft it trains is served as the eyas draft that computes exactly
its logits at every training-time-test step; a copy that computes anything else is refused."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from eyas.config import DraftConfig, TrainConfig
from eyas.train.data import StoredData

pytestmark = pytest.mark.specforge

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

STEPS = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    pytest.importorskip("specforge.algorithms.eagle3.model")
    from tests.helpers import tiny_training_world

    return tiny_training_world(tmp_path_factory.mktemp("specforge"))


def test_specforge_trains_on_eyas_batches_and_its_draft_loads_as_it_computes(world, tmp_path):
    from peer_recipe import SPECFORGE_NORMS, train_specforge

    from eyas.draft.load import load
    from eyas.targets.parts import target_parts

    draft_dir, tokens_per_s = train_specforge(
        world.offline, str(world.target), tmp_path, TrainConfig(ttt_steps=STEPS, batch_size=4),
        DraftConfig(vocab_size=128), stop_after=2)
    assert tokens_per_s > 0
    loaded = load(draft_dir, target_parts(str(world.target))[0]).draft
    config = loaded.config
    assert {k: getattr(config, k) for k in SPECFORGE_NORMS} == SPECFORGE_NORMS
    assert torch.count_nonzero(loaded.lm_head.weight) > 0


def _trained_pair(world, dtype=torch.float32):
    """SpecForge's draft (in `dtype`, as its trainer holds it) after two of its optimizer
    steps, and the eyas draft holding its weights; one batch and SpecForge's inputs for it."""
    from peer_recipe import _specforge_inputs, copy_weights, specforge_draft, use_reference_loss
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.optimizer import BF16Optimizer

    from eyas.train.data import batches

    use_reference_loss()
    torch.manual_seed(0)
    ds = StoredData(world.offline)
    model, draft, head, _ = specforge_draft(ds, str(world.target), DraftConfig(vocab_size=128),
                                            dtype)
    trainer = OnlineEagle3Model(model, length=STEPS, attention_backend="sdpa")
    opt = BF16Optimizer(model, lr=3e-3, total_steps=2, warmup_ratio=0)
    for _, batch in batches(ds, 4, 0, range(2)):
        inputs = _specforge_inputs(batch, head, dtype)
        sum(trainer(**inputs)[0]).backward()
        opt.step()
    with torch.no_grad():  # norms away from 1, so a norm applied in the wrong place shows
        for name, p in model.named_parameters():
            if p.requires_grad and p.dim() == 1:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    copy_weights(model.state_dict(), draft, "SpecForge's")
    return model, draft, batch, inputs


@pytest.mark.parametrize("damage", [None, "bfloat16", "norm_before_residual", "norm_output",
                                    "one_position_later", "specforge_scheme"])
def test_a_copy_computing_other_logits_than_specforge_is_refused(world, damage):
    """None and bfloat16: the faithful copy passes, also of a draft SpecForge held in bf16
    (whose RoPE tables, embedding and inputs are bf16-rounded; the check compares weights)."""
    from peer_recipe import check_specforge_copy

    model, draft, batch, inputs = _trained_pair(
        world, torch.bfloat16 if damage == "bfloat16" else torch.float32)
    if damage == "norm_before_residual":
        draft.midlayer.norm_before_residual = True
    elif damage == "norm_output":  # only the steps after the first see it
        draft.config = replace(draft.config, norm_output=True)
    elif damage == "one_position_later":  # SpecForge's inputs fed one token late
        inputs = {**inputs, "input_ids": torch.roll(inputs["input_ids"], 1, dims=1)}
    # SpecForge 0.2.0 unrolls as vLLM drafts (train.ttt_scheme=inference), not as the scheme
    # eyas named after it
    scheme = "specforge" if damage == "specforge_scheme" else "inference"
    if damage in (None, "bfloat16"):
        assert check_specforge_copy(model, draft, batch, inputs, STEPS, scheme) < 1e-5
    else:
        with pytest.raises(RuntimeError, match="computes other logits"):
            check_specforge_copy(model, draft, batch, inputs, STEPS, scheme)
