"""eyas's P-EAGLE objective is its reference's: the same weights, on the same batch, give the
same loss and the same gradients in eyas (eyas/draft/peagle/model.py through eyas/draft/ttt.py,
as the trainer calls it) and in speculators' own `PEagleDraftModel` forward (its COD-sampled
(anchor, depth) rows packed into one sequence, its mask positions reading mask_token_id and
fc(mask_hidden), its flex mask, and one KL mean over every sampled row of every depth).

What is fed alike, and why:
- speculators' trainer shifts a P-EAGLE batch as EAGLE-3's (shift_batch): row q = (h_q,
  x_{q+1}, v_{q+1}), masked by the token it reads, x_{q+1}; eyas masks a row by the token it
  predicts, x_{q+2}. Shifting the mask by one more feeds both the same rows (the data
  convention of tests/unit/test_peer_objective.py); fed its own, the reference scores other
  rows (a damaged run below).
- speculators samples each depth's rows at random (generate_cod_sample_indices: depth d keeps
  int((N-d) * max(ratio**d, ratio_min)) of its candidates); eyas scores every row. With
  down_sample_ratio=2.0 the reference's own sampler keeps every candidate, drawing nothing:
  depth 0 every row, depth d >= 1 every anchor whose depths 1..d predict loss tokens (eyas's
  Family.chained_rows), so the rows are the same on both sides, and so are the depth weights
  (1 each: train.step_loss_decay=1 in eyas)."""
from __future__ import annotations

import dataclasses
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from eyas.config import DraftConfig
from eyas.draft.ttt import collate, decay_weights, pooled, step_positions, ttt_loss
from eyas.draft.weights import canonical
from eyas.train.data import StoredData
from eyas.train.loop import build_draft

pytestmark = pytest.mark.speculators

STEPS, LAYERS, SHARPEN, GAIN = 4, 2, 20.0, 3.0
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from peer_peagle import KEEP_ALL  # noqa: E402  (down_sample_ratio 2.0 keeps every row)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@dataclasses.dataclass
class Worlds:
    draft: torch.nn.Module  # eyas's PEagleDraft
    head: torch.nn.Module  # the target head eyas trains against
    model: torch.nn.Module  # speculators' PEagleDraftModel, holding the same weights
    data: StoredData


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> Worlds:
    """On the tiny target, a 2-layer P-EAGLE draft with a 128-token draft vocabulary, its norms
    away from 1, its other weights GAIN times their init (a token read one row off moves the
    loss by 1%, not 0.2%) and its heads sharpened (near-uniform distributions make every KL
    small: a wrong row would hardly show), copied into speculators' PEagleDraftModel."""
    pytest.importorskip("speculators.models.peagle")
    from peer_peagle import peer_model

    from tests.helpers import tiny_training_world

    world = tiny_training_world(tmp_path_factory.mktemp("peagle"))
    data = StoredData(world.offline)
    torch.manual_seed(0)
    draft, head, vocab = build_draft(data, str(world.target), DraftConfig(
        family="peagle", num_layers=LAYERS, vocab_size=128))
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad and p.dim() == 1:
                p.copy_(1 + 0.5 * torch.randn_like(p))
            elif p.requires_grad and p is not draft.lm_head.weight:
                p.mul_(GAIN)
        draft.mask_hidden.copy_(torch.randn_like(draft.mask_hidden))
        draft.lm_head.weight.mul_(SHARPEN)
        head.lm_head.weight.mul_(SHARPEN)
    # the bench's peer (bench/peer_peagle.py): eyas's weights, the target's head as its
    # verifier's, its embedding frozen as eyas keeps it
    model = peer_model(data, str(world.target), draft, head, vocab)
    assert torch.equal(model.embed_tokens.weight, draft.embed_tokens.weight)
    # speculators freezes the draft's lm_head (eyas's train.freeze_lm_head): both train it here
    model.lm_head.weight.requires_grad_(True)
    return Worlds(draft, head, model, data)


def _speculators(model, batch, shift_mask: int = 1, documents: bool = True):
    """speculators' loss on eyas's batch as bench/peer_peagle.py feeds it (`documents` False:
    its samples packed as one)."""
    from peer_peagle import speculators_loss
    from speculators.losses import resolve_loss_config

    return speculators_loss(model, batch, resolve_loss_config("kl_div", "eager"), STEPS,
                            shift_mask=shift_mask, documents=documents)


def _eyas(w: Worlds, batch, *, chained: bool = True, pool: bool = True, decay: float = 1.0):
    """eyas's loss as the trainer computes it for a P-EAGLE draft (pooled, chained rows), with
    the reference's depth weights (1 each); the flags damage it."""
    counts = step_positions(batch, STEPS, chained=chained)
    return ttt_loss(w.draft, batch, w.head, STEPS, loss="kl", chained=chained,
                    denominators=pooled(counts) if pool else None,
                    step_weights=decay_weights(STEPS, decay)).loss


def _batch(w: Worlds, samples: int):
    return collate([w.data.train[i] for i in range(samples)], w.data.layout)


def test_keep_all_sampling_is_every_chained_row(worlds):
    """The reference's own sampler, at KEEP_ALL, draws nothing: the same (anchor, depth) rows
    every call, every row at depth 0, and per depth as many scored rows as eyas counts with
    chained rows (fewer than without: the chain rule matters on this batch)."""
    from peer_peagle import packed
    from speculators.models.peagle.data import generate_cod_sample_indices

    batch = _batch(worlds, 1)
    mask = packed(batch)["mask"]
    n = mask.shape[1]
    anchor, depth = generate_cod_sample_indices(n, mask.long(), STEPS, KEEP_ALL)
    again = generate_cod_sample_indices(n, mask.long(), STEPS, KEEP_ALL)
    assert torch.equal(anchor, again[0]) and torch.equal(depth, again[1])
    assert torch.equal(anchor[depth == 0], torch.arange(n))
    scored = mask[0, anchor + depth]
    theirs = [int(scored[depth == d].sum()) for d in range(STEPS)]
    assert theirs == step_positions(batch, STEPS, chained=True)
    assert theirs != step_positions(batch, STEPS)


@pytest.mark.parametrize("samples", [1, 2])  # one sequence; two, packed there and padded here
def test_peagle_loss_and_gradients_equal_speculators(worlds, samples):
    w = worlds
    batch = _batch(w, samples)
    if samples == 2:
        assert not batch.attention_mask.all()  # a padded row
    for module in (w.draft, w.model):
        module.zero_grad(set_to_none=True)
    theirs = _speculators(w.model, batch)
    ours = _eyas(w, batch)
    assert float(ours.detach()) > 1.0  # far from 0: a wrong row or weight shows
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5)
    theirs.backward()
    ours.backward()
    mine = {n: p for n, p in w.draft.named_parameters() if p.requires_grad}
    trained = {canonical(n): p for n, p in w.model.named_parameters() if p.requires_grad}
    # speculators would train the embedding too (embed_requires_grad); the bench freezes it
    # as eyas keeps the target's: every trained tensor is shared
    assert set(trained) == set(mine)
    assert {"mask_hidden", "fc.weight", "input_norm.weight", "midlayer.hidden_norm.weight",
            "layers.1.self_attn.q_proj.weight", "lm_head.weight"} <= set(mine)
    for name, p in mine.items():
        grad = trained[name].grad.reshape(p.shape)
        # float32 summed in another order (oneDNN's kernels differ by CPU: AMX, AVX-512)
        # moves a gradient by a few 1e-6 of its tensor's largest; a wrong row or weight moves
        # it by the whole of it
        assert torch.allclose(p.grad, grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max())), name


@contextmanager
def _unnormed_mask_hidden(draft):
    """The mask positions fed fc(mask_hidden) without the norms before fc (vLLM and the
    reference put mask_hidden through input_norm and fc_norm as they do a target state)."""
    project = draft.project
    draft.project = lambda slots: draft.fc(slots) if slots is draft.mask_hidden else project(slots)
    try:
        yield
    finally:
        del draft.project


@contextmanager
def _mask_token(draft, token: int):
    """The mask positions reading `token`'s embedding instead of mask_token_id's."""
    config = draft.config
    assert token != config.mask_token_id
    draft.config = dataclasses.replace(config, mask_token_id=token)
    try:
        yield
    finally:
        draft.config = config


def _rolled(batch, shift: int):
    """The batch with its tokens moved by `shift` rows: step 0's row r reads x_{r+1-shift}, the
    EAGLE shift removed (1) or doubled (-1); targets and masks stay."""
    return dataclasses.replace(batch, input_ids=batch.input_ids.roll(shift, 1))


DAMAGES = {  # what each damaged run changes; each must move the loss away from the reference
    "eagle_shift_removed": lambda w, b: _eyas(w, _rolled(b, 1)),
    "eagle_shift_doubled": lambda w, b: _eyas(w, _rolled(b, -1)),
    # speculators fed its own mask, by the token a row reads: every row off by one
    "mask_by_the_token_read": lambda w, b: _speculators(w.model, b, shift_mask=0),
    # the second sample attending the first's rows, which eyas's padded batch keeps apart
    "one_document_for_two_samples": lambda w, b: _speculators(w.model, b, documents=False),
    "a_mean_per_depth": lambda w, b: _eyas(w, b, pool=False),
    "decayed_depth_weights": lambda w, b: _eyas(w, b, decay=0.8),
    "unchained_rows": lambda w, b: _eyas(w, b, chained=False),
    "mask_hidden_without_its_norms": lambda w, b: _run(_unnormed_mask_hidden(w.draft), w, b),
    "mask_positions_read_token_0": lambda w, b: _run(_mask_token(w.draft, 0), w, b),
}


def _run(damage, w, batch):
    with damage:
        return _eyas(w, batch)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_peagle_objective_is_told_apart(worlds, damage):
    """Each damage alone, on the batch where eyas equals the reference, moves eyas's loss (or
    the reference's) away from the other's."""
    batch = _batch(worlds, 2)
    with torch.no_grad():
        theirs = float(_speculators(worlds.model, batch))
        assert float(_eyas(worlds, batch)) == pytest.approx(theirs, rel=1e-5)
        damaged = float(DAMAGES[damage](worlds, batch))
        assert float(_eyas(worlds, batch)) == pytest.approx(theirs, rel=1e-5)  # undone
    assert damaged != pytest.approx(theirs, rel=1e-3)


def test_the_trainer_trains_peagle_on_the_reference_objective(tmp_path):
    """The first step's loss the trainer reports is the pooled mean over chained rows, neither
    eyas's per-position mean nor the pool of every row whose own token counts."""
    from eyas.train.data import batches
    from eyas.train.loop import train_draft
    from tests.helpers import tiny_train_settings, tiny_training_world

    w = tiny_training_world(tmp_path)
    train, settings = tiny_train_settings()
    train = dataclasses.replace(train, epochs=1, precision="float32", ttt_steps=STEPS)
    settings = dataclasses.replace(settings, family="peagle", num_layers=LAYERS)
    report = train_draft(str(w.offline), str(w.target), str(tmp_path / "train"), train,
                         settings, stop_after=1)
    data = StoredData(w.offline)
    torch.manual_seed(train.seed)
    draft, head, _ = build_draft(data, str(w.target), settings)
    (_, batch), = batches(data, train.batch_size, train.seed, range(1))
    weights = decay_weights(STEPS, train.step_loss_decay)

    def loss(chained: bool, pool: bool) -> float:
        counts = step_positions(batch, STEPS, chained=chained)
        with torch.no_grad():
            return float(ttt_loss(draft, batch, head, STEPS, step_weights=weights,
                                  denominators=pooled(counts) if pool else counts,
                                  chained=chained, loss=train.loss).loss)

    assert report.losses[0] == pytest.approx(loss(True, True), rel=1e-5)
    assert report.losses[0] != pytest.approx(loss(True, False), rel=1e-2)
    assert report.losses[0] != pytest.approx(loss(False, True), rel=1e-4)


def test_eyas_bench_peer_peagle_needs_a_spread_to_hold_eyas_to(capsys):
    """The full-run comparison (bench/peer_peagle.py) refuses one seed through the command a
    user types, before reading the run: one seed has no run-to-run range."""
    from eyas import cli

    code = cli.main(["bench", "peer-peagle", "/nonexistent/run", "--seeds", "0"])
    err = capsys.readouterr().err
    assert code != 0 and "at least two" in err and "/nonexistent" not in err
