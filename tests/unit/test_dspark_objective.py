"""eyas's DSpark objective is its reference's: the same weights, on the same batch and the same
anchors, give the same loss and the same gradients in eyas (eyas/draft/dspark/model.py through
eyas/draft/ttt.py) and in speculators' own `DSparkDraftModel` forward (DFlash's anchored block
with sample_from_anchor: every slot k = 0..B-1 drafts, scored against the verifier at the
slot's own position; the Markov bias of the slot's previous block token, teacher forced; the
KL weighted exp(-k/gamma) from k = 0 over every scored slot; the confidence head's BCE against
1 - TV(draft, target), detached, weighted alike, times confidence_head_alpha 1).

One data convention differs, not the objective: speculators keeps slot k where the loss mask
is set at the slot's INPUT token (x_{a+k}, a the anchor's position), eyas where it is set at
the token the slot PREDICTS (x_{a+k+1}, eyas.draft.ttt.counted_rows). speculators is therefore
fed the loss mask shifted left by one (its anchors drawn on that mask too), so that both score
the same slots, as tests/unit/test_peer_objective.py does for EAGLE-3.

The damaged objectives below are told apart: the Markov head fed the token one position
early, the confidence term dropped, and the anchor's slot not drafting (DFlash's alignment).
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
import torch

from eyas.config import DraftConfig
from eyas.draft.dspark.model import DSparkDraft
from eyas.draft.ttt import collate, decay_weights, pooled, step_positions, ttt_loss
from eyas.train.data import StoredData
from eyas.train.loop import build_draft

pytestmark = pytest.mark.speculators

BLOCK, GAMMA, SHARPEN, RANK = 4, 4.0, 20.0, 8
SEED = 3


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _worlds(tmp_path, layers=2):
    """(eyas DSpark draft, the target head eyas trains against, speculators' DSparkDraftModel
    holding the same weights, the batch) on the tiny target, full vocabulary."""
    dspark = pytest.importorskip("speculators.models.dspark")
    from transformers import AutoConfig

    from eyas.targets import text_config
    from helpers import give_eyas_weights, tiny_training_world

    world = tiny_training_world(tmp_path)
    data = StoredData(world.offline)
    target_config = text_config(AutoConfig.from_pretrained(world.target))
    torch.manual_seed(0)
    draft, head, vocab = build_draft(data, str(world.target), DraftConfig(
        family="dspark", block_size=BLOCK, num_layers=layers, markov_rank=RANK,
        vocab_size=target_config.vocab_size))
    assert isinstance(draft, DSparkDraft)
    with torch.no_grad():  # norms away from 1, so a norm in the wrong place shows
        for name, p in draft.named_parameters():
            if p.requires_grad and p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
        # sharpened heads, so that a wrong row shows in the KL; a Markov bias as large as
        # the base logits' spread, so that a wrong previous token shows
        draft.lm_head.weight.mul_(SHARPEN)
        head.lm_head.weight.mul_(SHARPEN)
        draft.markov_head.markov_w1.weight.normal_()
        draft.markov_head.markov_w2.weight.mul_(3.0)
    layer_config = text_config(AutoConfig.from_pretrained(world.target))
    layer_config.num_hidden_layers = layers
    model = dspark.DSparkDraftModel.from_training_args(
        layer_config, draft_vocab_size=vocab.size, block_size=BLOCK, markov_rank=RANK,
        verifier_name_or_path=str(world.target),
        target_layer_ids=list(range(1, len(data.layout.draft_inputs) + 1)),
        mask_token_id=draft.config.mask_token_id, draft_attn_impl="eager")
    assert model.config.sample_from_anchor and model.config.confidence_head_with_markov
    give_eyas_weights(model, draft, head, "DSpark")
    batch = collate([data.train[0]], data.layout)
    return draft, head, model, batch


def _their_mask(batch) -> torch.Tensor:
    """The loss mask as speculators reads it: set at the slot's input token (module doc)."""
    mask = torch.zeros_like(batch.loss_mask, dtype=torch.long)
    mask[:, :-1] = batch.loss_mask[:, 1:].long()
    return mask


def _anchors(batch, count: int):
    """speculators' own draw of anchors (select_anchors, seeded, on the mask it is fed), and
    eyas's anchor rows for them: the anchor at position a holds the bonus token x_a, the
    block eyas computes at row a-1."""
    from speculators.models.dflash.utils import select_anchors

    torch.manual_seed(SEED)
    positions, valid = select_anchors(_their_mask(batch), count, BLOCK)
    positions = positions[valid]
    assert int(positions.min()) >= 1
    rows = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    rows[0, positions - 1] = True
    return rows


def _speculators(model, batch, count: int):
    from speculators.losses import resolve_loss_config
    from speculators.losses.eager import tv_loss

    torch.manual_seed(SEED)  # the same draw as _anchors
    n = batch.input_ids.shape[1]
    _, loss, _ = model(
        hidden_states=batch.hidden, input_ids=batch.input_ids, loss_mask=_their_mask(batch),
        verifier_last_hidden_states=batch.verifier,
        document_ids=torch.zeros(1, n, dtype=torch.long),
        loss_config=resolve_loss_config("kl_div", "eager"), tv_loss_fn=tv_loss, gamma=GAMMA,
        max_anchors=count, confidence_head_alpha=1.0)
    return loss


def _eyas(draft, head, batch, anchors, steps: int = BLOCK):
    batch.anchors = anchors
    return ttt_loss(draft, batch, head, steps, loss="kl",
                    denominators=pooled(step_positions(batch, steps)),
                    step_weights=decay_weights(steps, math.exp(-1 / GAMMA))).loss


@contextmanager
def _patched(obj, name, value):
    old = obj.__dict__.get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if old is None:
            delattr(obj, name)
        else:
            setattr(obj, name, old)


def _early_markov_token():
    """Slot k's Markov bias and confidence read x_{r+k} instead of x_{r+k+1}."""
    honest = DSparkDraft.previous_tokens

    def early(self, base, input_ids, at_rows):
        return honest(self, base, input_ids, (at_rows - 1).clamp(min=0))
    return _patched(DSparkDraft, "previous_tokens", early)


def _grads(module, names):
    return {n: p.grad.clone() for n, p in module.named_parameters() if n in names}


@pytest.mark.parametrize("count", [6, 64])  # some rows anchored; every eligible row
def test_dspark_loss_and_gradients_equal_speculators(tmp_path, count):
    draft, head, model, batch = _worlds(tmp_path)
    anchors = _anchors(batch, count)
    assert 0 < int(anchors.sum()) <= count
    theirs = _speculators(model, batch, count)
    ours = _eyas(draft, head, batch, anchors)
    assert float(ours.detach()) > 0.5  # far from 0: a wrong row or weight shows
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    trained &= {n for n, p in draft.named_parameters() if p.requires_grad}
    assert {"fc.weight", "layers.1.self_attn.k_norm.weight", "markov_head.markov_w1.weight",
            "markov_head.markov_w2.weight", "confidence_head.proj.weight",
            "confidence_head.proj.bias"} <= trained
    theirs.backward()
    ours.backward()
    mine = dict(draft.named_parameters())
    for name, grad in _grads(model, trained).items():
        assert float(grad.abs().max()) > 0, name
        assert torch.allclose(mine[name].grad, grad, rtol=1e-4,
                              atol=1e-6 * float(grad.abs().max())), name


def test_a_damaged_dspark_objective_is_told_apart(tmp_path):
    """What the comparison catches: the Markov head fed the token one position early, the
    confidence head's term dropped, and slot 0 (the anchor's) not drafting, DFlash's
    alignment, its B-1 masks drafting x_{r+2}.. instead."""
    draft, head, model, batch = _worlds(tmp_path)
    anchors = _anchors(batch, 6)
    with torch.no_grad():
        theirs = float(_speculators(model, batch, 6))
        assert float(_eyas(draft, head, batch, anchors)) == pytest.approx(theirs, rel=1e-5)
        with _early_markov_token():
            early = float(_eyas(draft, head, batch, anchors))
        with _patched(draft, "auxiliary_loss", lambda conf, *rest, **kw: conf.new_zeros(())):
            no_confidence = float(_eyas(draft, head, batch, anchors))
        with _patched(draft, "first_slot", 1):
            dflash_alignment = float(_eyas(draft, head, batch, anchors, BLOCK - 1))
    for damaged in (early, no_confidence, dflash_alignment):
        assert damaged != pytest.approx(theirs, rel=1e-3), (damaged, theirs)


def test_the_trainer_trains_dspark_on_the_pooled_mean_with_the_confidence_term(tmp_path):
    """The first step's loss the trainer reports is the pooled mean over the block's B slots,
    the confidence term in it (the default ce loss: against the target's best draft token)."""
    import dataclasses

    from eyas.train.data import batches
    from eyas.train.loop import train_draft
    from helpers import tiny_train_settings, tiny_training_world

    w = tiny_training_world(tmp_path)
    train, settings = tiny_train_settings()
    train = dataclasses.replace(train, epochs=1, precision="float32")
    settings = dataclasses.replace(settings, family="dspark", block_size=BLOCK, markov_rank=RANK)
    report = train_draft(str(w.offline), str(w.target), str(tmp_path / "train"), train,
                         settings, stop_after=1)
    data = StoredData(w.offline)
    torch.manual_seed(train.seed)
    draft, head, _ = build_draft(data, str(w.target), settings)
    (_, batch), = batches(data, train.batch_size, train.seed, range(1))
    counts = step_positions(batch, BLOCK, train.loss_tokens == "all")
    weights = decay_weights(BLOCK, train.step_loss_decay)

    def loss(denominators):
        return float(ttt_loss(draft, batch, head, BLOCK, step_weights=weights,
                              denominators=denominators, loss=train.loss,
                              all_tokens=train.loss_tokens == "all").loss)
    with torch.no_grad():
        want, per_position = loss(pooled(counts)), loss(None)
        with _patched(draft, "auxiliary_loss", lambda conf, *rest, **kw: conf.new_zeros(())):
            no_confidence = loss(pooled(counts))
    assert report.losses[0] == pytest.approx(want, rel=1e-5)
    assert per_position != pytest.approx(want, rel=1e-2)
    assert no_confidence < want - 0.1  # the BCE of an untrained head: about log 2 a slot
