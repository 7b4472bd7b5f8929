"""eyas's DFlash objective is its reference's: the same weights, on the same batch and the same
anchors, give the same loss and the same gradients in eyas (eyas/draft/dflash/model.py through
eyas/draft/ttt.py) and in speculators' own `DFlashDraftModel` forward (its anchored-block
mask, its targets read from the verifier one row before each block position, its
exp(-(j-1)/gamma) position weights and KL loss). DFlash pairs block position j of the anchor
at row a with the verifier state at a+j-1: no EAGLE shift, which the damaged runs below add."""
from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch

from eyas.config import DraftConfig
from eyas.draft.ttt import collate, decay_weights, pooled, step_positions, ttt_loss
from eyas.train.data import StoredData
from eyas.train.loop import build_draft

pytestmark = pytest.mark.speculators

BLOCK, GAMMA, SHARPEN = 4, 4.0, 20.0


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _worlds(tmp_path, layers=2):
    """(eyas DFlash draft, the target head eyas trains against, speculators' DFlashDraftModel
    holding the same weights, the batch) on the tiny target, full vocabulary (speculators'
    full-vocab DFlash serves the target's own head; eyas's keeps the same rows)."""
    dflash = pytest.importorskip("speculators.models.dflash")
    from transformers import AutoConfig

    from eyas.targets import text_config
    from tests.helpers import give_eyas_weights, tiny_training_world

    world = tiny_training_world(tmp_path)
    data = StoredData(world.offline)
    target_config = text_config(AutoConfig.from_pretrained(world.target))
    torch.manual_seed(0)
    draft, head, vocab = build_draft(data, str(world.target), DraftConfig(
        family="dflash", block_size=BLOCK, num_layers=layers,
        vocab_size=target_config.vocab_size))
    with torch.no_grad():  # norms away from 1, so a norm in the wrong place shows
        for name, p in draft.named_parameters():
            if p.requires_grad and p.dim() == 1:
                p.copy_(1 + 0.5 * torch.randn_like(p))
        # near-uniform random distributions would make every KL term small: sharpen both
        # heads (the draft's holds the target's rows) so a wrong row shows in the sum
        draft.lm_head.weight.mul_(SHARPEN)
        head.lm_head.weight.mul_(SHARPEN)
    layer_config = text_config(AutoConfig.from_pretrained(world.target))
    layer_config.num_hidden_layers = layers
    model = dflash.DFlashDraftModel.from_training_args(
        layer_config, draft_vocab_size=vocab.size, block_size=BLOCK,
        verifier_name_or_path=str(world.target),
        target_layer_ids=list(range(1, len(data.layout.draft_inputs) + 1)),
        mask_token_id=draft.config.mask_token_id, draft_attn_impl="eager")
    give_eyas_weights(model, draft, head, "DFlash")
    batch = collate([data.train[0]], data.layout)
    return draft, head, model, batch


def _anchors(batch, count: int, seed: int):
    """speculators' own draw of anchors for this batch (select_anchors, seeded), and eyas's
    anchor rows for them: speculators' anchor at position a holds the bonus token x_a, the
    block eyas computes at row a-1 (context rows 0..a-1, bonus x_a)."""
    from speculators.models.dflash.utils import select_anchors

    torch.manual_seed(seed)
    positions, valid = select_anchors(batch.loss_mask.long(), count, BLOCK)
    positions = positions[valid]
    rows = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    rows[0, positions - 1] = True
    return rows


def _speculators(model, batch, count: int, seed: int):
    from speculators.losses import resolve_loss_config

    torch.manual_seed(seed)  # the same draw as _anchors
    n = batch.input_ids.shape[1]
    _, loss, _ = model(
        hidden_states=batch.hidden, input_ids=batch.input_ids,
        loss_mask=batch.loss_mask.long(), verifier_last_hidden_states=batch.verifier,
        document_ids=torch.zeros(1, n, dtype=torch.long), loss_config=resolve_loss_config(
            "kl_div", "eager"), gamma=GAMMA, max_anchors=count)
    return loss


def _eyas(draft, head, batch, anchors, shift: int = 0, reference: bool = True):
    """eyas's loss with the reference's gamma; `shift` moves the anchors' rows by one (the
    EAGLE shift DFlash does not have: a damaged objective)."""
    steps = BLOCK - 1
    batch.anchors = anchors.roll(shift, 1)
    denominators = pooled(step_positions(batch, steps)) if reference else None
    return ttt_loss(draft, batch, head, steps, loss="kl", denominators=denominators,
                    step_weights=decay_weights(steps, math.exp(-1 / GAMMA))).loss


@contextmanager
def _causal_block():
    """eyas's DFlash attention with its block made causal (a mask position j sees the bonus
    and masks up to j only): the damage the comparison must catch."""
    from eyas.draft.dflash import model as dflash_model

    einsum = torch.einsum

    def masked(spec, *xs):
        out = einsum(spec, *xs)
        if spec == "brshd,bruhd->bhrsu":  # block scores [B, h, A, S, S]
            s = out.shape[-1]
            later = torch.ones(s, s, dtype=torch.bool).triu(1)
            out = out.masked_fill(later, float("-inf"))
        return out

    dflash_model.torch.einsum = masked
    try:
        yield
    finally:
        dflash_model.torch.einsum = einsum


def _grads(module, names):
    return {n: p.grad.clone() for n, p in module.named_parameters() if n in names}


@pytest.mark.parametrize("count", [6, 64])  # some rows anchored; every eligible row
def test_dflash_loss_and_gradients_equal_speculators(tmp_path, count):
    draft, head, model, batch = _worlds(tmp_path)
    anchors = _anchors(batch, count, seed=3)
    assert 0 < int(anchors.sum()) <= count
    theirs = _speculators(model, batch, count, seed=3)
    ours = _eyas(draft, head, batch, anchors)
    assert float(ours.detach()) > 0.5  # far from 0: a wrong row or weight shows
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    trained &= {n for n, p in draft.named_parameters() if p.requires_grad}
    assert {"fc.weight", "layers.1.self_attn.k_norm.weight", "hidden_norm.weight"} <= trained
    theirs.backward()
    ours.backward()
    for name, grad in _grads(model, trained).items():
        mine = dict(draft.named_parameters())[name].grad
        assert torch.allclose(mine, grad, rtol=1e-4, atol=1e-6 * float(grad.abs().max())), name


def test_a_damaged_dflash_objective_is_told_apart(tmp_path):
    """What the comparison catches: the EAGLE shift added (each anchor's block one row late),
    the block attention made causal, and eyas's per-position mean in place of the
    reference's mean over every scored position of the batch."""
    draft, head, model, batch = _worlds(tmp_path)
    anchors = _anchors(batch, 6, seed=3)
    with torch.no_grad():
        theirs = float(_speculators(model, batch, 6, seed=3))
        assert float(_eyas(draft, head, batch, anchors)) == pytest.approx(theirs, rel=1e-5)
        assert float(_eyas(draft, head, batch, anchors, shift=1)) != pytest.approx(theirs,
                                                                                  rel=1e-3)
        per_position = float(_eyas(draft, head, batch, anchors, reference=False))
        assert per_position != pytest.approx(theirs, rel=1e-3)
        with _causal_block():
            causal = float(_eyas(draft, head, batch, anchors))
        assert causal != pytest.approx(theirs, rel=1e-3)


def test_the_trainer_trains_dflash_on_the_pooled_mean(tmp_path):
    """The first step's loss the trainer reports is the reference's pooled mean on that batch,
    not eyas's per-position mean (which a chain family keeps)."""
    import dataclasses

    from eyas.train.data import batches
    from eyas.train.loop import train_draft
    from tests.helpers import tiny_train_settings, tiny_training_world

    w = tiny_training_world(tmp_path)
    train, settings = tiny_train_settings()
    train = dataclasses.replace(train, epochs=1, precision="float32")
    settings = dataclasses.replace(settings, family="dflash", block_size=BLOCK)
    report = train_draft(str(w.offline), str(w.target), str(tmp_path / "train"), train,
                         settings, stop_after=1)
    data = StoredData(w.offline)
    torch.manual_seed(train.seed)
    draft, head, _ = build_draft(data, str(w.target), settings)
    (_, batch), = batches(data, train.batch_size, train.seed, range(1))
    steps = BLOCK - 1
    counts = step_positions(batch, steps, train.loss_tokens == "all")
    weights = decay_weights(steps, train.step_loss_decay)
    with torch.no_grad():
        want, per_position = (float(ttt_loss(draft, batch, head, steps, step_weights=weights,
                                             denominators=d, all_tokens=train.loss_tokens == "all",
                                             loss=train.loss).loss)
                              for d in (pooled(counts), None))
    assert report.losses[0] == pytest.approx(want, rel=1e-5)
    assert per_position != pytest.approx(want, rel=1e-2)
