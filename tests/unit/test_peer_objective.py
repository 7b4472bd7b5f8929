"""eyas's training objective is the peer trainer's: the same draft weights, on the same batch,
give the same TTT loss in eyas (eyas/draft/ttt.py) and in speculators' own Eagle3DraftModel
forward (its TTT unroll, masks, norm options and KL loss). bench/peer_recipe.py trains the
peer's recipe with that forward; this is why a recipe difference there is not in the maths."""
from __future__ import annotations

import pytest
import torch

from eyas.config import DraftConfig
from eyas.draft.weights import canonical
from eyas.draft.ttt import collate, decay_weights, ttt_loss
from eyas.train.data import StoredData
from eyas.train.loop import build_draft

pytestmark = pytest.mark.speculators

STEPS, DECAY, SHARPEN = 3, 0.8, 20.0


def _speculators_loss(model, batch, ttt_steps: int, shift_mask: int) -> float:
    """speculators' loss on a one-sample batch, fed as its collator and shift_batch feed it."""
    from speculators.losses import resolve_loss_config

    ids, hidden, verifier = batch.input_ids[0], batch.hidden[0], batch.verifier[0]
    n = len(ids)
    mask = batch.loss_mask[0].bool()
    # speculators masks row r by the token it reads (x_{r+1}); eyas by the token it predicts
    # (x_{r+2}): shifting the mask by one more feeds both the same rows
    mask = torch.cat([mask[shift_mask:], mask.new_zeros(shift_mask)])
    _, loss, _ = model(
        hidden_states=hidden[None, :n - 1], input_ids=ids[None, 1:],
        document_ids=torch.zeros(1, n - 1, dtype=torch.long), loss_mask=mask[None, 1:],
        position_ids=torch.arange(1, n)[None], verifier_last_hidden_states=verifier[None, 1:],
        ttt_steps=ttt_steps, ttt_step_loss_decay=DECAY,
        loss_config=resolve_loss_config("kl_div", "eager"))
    return float(loss)


@pytest.mark.parametrize("norms", [True, False])
def test_eyas_ttt_loss_equals_speculators_forward(tmp_path, norms):
    eagle3 = pytest.importorskip("speculators.models.eagle3")
    from transformers import AutoConfig

    from tests.helpers import tiny_training_world

    world = tiny_training_world(tmp_path)
    data = StoredData(world.offline)
    options = dict(norm_before_fc=norms, norm_before_residual=norms, norm_output=norms)
    torch.manual_seed(0)
    draft, head, vocab = build_draft(data, str(world.target), DraftConfig(vocab_size=128,
                                                                          **options))
    with torch.no_grad():  # norms away from 1, so a norm applied in the wrong place shows
        for name, p in draft.named_parameters():
            if p.requires_grad and p.dim() == 1:
                p.copy_(1 + 0.5 * torch.randn_like(p))
        # the random target's next-token distributions are near uniform: sharpen both heads so
        # that KL terms are far from 0 and a wrong row or step shows in the sum
        draft.lm_head.weight.mul_(SHARPEN)
        head.lm_head.weight.mul_(SHARPEN)
    config = AutoConfig.from_pretrained(world.target)
    config.num_hidden_layers = 1
    model = eagle3.Eagle3DraftModel.from_training_args(
        config, t2d=vocab.t2d, d2t=vocab.d2t, draft_vocab_size=vocab.size, ttt_steps=STEPS,
        verifier_name_or_path=str(world.target), target_layer_ids=[1, 2, 3],
        draft_attn_impl="sdpa", **options)
    ours = draft.state_dict()
    wanted = set(ours) - {"embed_tokens.weight", "d2t", "t2d"}  # the target's, eyas's vocab
    theirs = model.state_dict()
    with torch.no_grad():
        for key, tensor in theirs.items():
            if canonical(key) in wanted:
                tensor.copy_(ours[canonical(key)])
                wanted.discard(canonical(key))
    assert not wanted, f"speculators' draft has no {sorted(wanted)}"
    model.load_state_dict(theirs)
    with torch.no_grad():
        model.verifier_lm_head.weight.mul_(SHARPEN)

    batch = collate([data.train[0]], data.layout)
    weights = decay_weights(STEPS, DECAY)
    with torch.no_grad():
        ours = float(ttt_loss(draft, batch, head, STEPS, step_weights=weights, loss="kl").loss)
        assert ours > 1.0
        peer = _speculators_loss(model, batch, STEPS, shift_mask=1)
        assert peer == pytest.approx(ours, rel=1e-5)
        # what the comparison tells apart: rows off by one (the mask unshifted), and
        # the other TTT scheme (train.ttt_scheme=specforge: positions fixed, step 0's latest
        # rows hidden)
        assert _speculators_loss(model, batch, STEPS, shift_mask=0) != pytest.approx(ours, rel=1e-5)
        other = float(ttt_loss(draft, batch, head, STEPS, step_weights=weights, scheme="specforge",
                               loss="kl").loss)
        assert other != pytest.approx(peer, rel=1e-5)


def test_speculators_recipe_trains_on_eyas_batches_into_a_draft_eyas_loads(tmp_path):
    pytest.importorskip("speculators.models.eagle3")
    import sys
    from pathlib import Path

    from eyas.config import TrainConfig
    from eyas.draft.load import load
    from eyas.targets.parts import target_parts
    from tests.helpers import tiny_training_world

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from peer_recipe import train_speculators

    world = tiny_training_world(tmp_path)
    torch.manual_seed(0)  # the shell train_speculators builds (train.seed 0) before the copy
    before, _, _ = build_draft(StoredData(world.offline), str(world.target),
                               DraftConfig(vocab_size=128))
    draft_dir, tokens_per_s = train_speculators(
        world.offline, str(world.target), tmp_path / "out", TrainConfig(ttt_steps=STEPS,
                                                                        batch_size=4),
        DraftConfig(vocab_size=128), stop_after=2)
    assert tokens_per_s > 0
    trained = load(draft_dir, target_parts(str(world.target))[0]).draft
    # the peer's trained weights reached the saved draft, not the shell they were copied into
    assert not torch.equal(trained.fc.weight, before.fc.weight)
