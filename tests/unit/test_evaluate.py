"""Standalone evaluation: alignment with training, conditional accuracy, predicted tau.

Also home of `world()`: a tiny trained Llama target, its extraction (layout [embed, block_out:1,
block_out:3] + a probe set of every layer) and a draft trained on it, built once per session
and shared by test_doctor.py and test_specdec.py.

The target learns a rule a one-layer draft can't read from its token input alone: in the
conversations, each letter is f(the letter two before), f a fixed permutation. The draft at
row r sees token r+1 and must say f(token r): it leans on the target's states at row r, so
feeding it the wrong slots costs accuracy, which is the doctor's evidence.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from eyas.draft.checkpoint import save_draft
from eyas.draft.model import DraftConfig, Eagle3Draft
from eyas.draft.ttt import decay_weights, ttt_loss
from eyas.target.parts import TargetHead
from eyas.draft.vocab import build_vocab, count_tokens
from eyas.engines import hf
from eyas.draft.accuracy import DURING_TRAINING, during_training_record
from eyas.draft.accuracy import (PositionCounts, StepAccuracy, collate, evaluate_draft,
                                      predicted_tau, score_batch)
from eyas.dataset.reader import ExtractedDataset, Sample
from eyas.extract.shards import probe_slots
from eyas.layout import HiddenStateLayout
from helpers import extract_tiny as _extract
from helpers import make_tiny_target, prepare_tiny, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

SLOTS = ["embed", "block_out:1", "block_out:3"]
LAYERS, HIDDEN, DRAFT_VOCAB, STEPS = 6, 32, 64, 3
LETTERS = "ABCDEFGHIJKLMNQRSTUVWXYZ"  # single tokens for the helper tokenizer, no merges
_WORLD: dict = {}


def rule_conversations(n: int, seed: int) -> list[list[dict]]:
    """[user: 6 letters, assistant: 8-14 more], letter t+1 = f(letter t-1)."""
    f = dict(zip(LETTERS, random.Random(0).sample(LETTERS, len(LETTERS))))
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = [rng.choice(LETTERS), rng.choice(LETTERS)]
        while len(s) < 6 + rng.randint(8, 14):
            s.append(f[s[-2]])
        out.append([{"role": "user", "content": "".join(s[:6])},
                    {"role": "assistant", "content": "".join(s[6:])}])
    return out


def _train_target(path: Path, steps: int = 200) -> None:
    """Teach the random target the rule, then make its final norm's gains uneven without
    changing its function (lm_head divides them back), as in real LMs: reading the verifier
    after the final norm then really gives other tokens."""
    torch.manual_seed(0)
    tok = tiny_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(path)
    docs = [torch.tensor(tok(tok.apply_chat_template(m, tokenize=False),
                             add_special_tokens=False)["input_ids"])
            for m in rule_conversations(1000, seed=5)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        pick = [docs[i] for i in torch.randint(0, len(docs), (16,), generator=gen)]
        ids = torch.nn.utils.rnn.pad_sequence(pick, batch_first=True,
                                              padding_value=tok.pad_token_id)
        labels = torch.nn.utils.rnn.pad_sequence(pick, batch_first=True, padding_value=-100)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        gains = torch.exp(torch.randn(model.config.hidden_size) * 1.5)
        model.model.norm.weight.mul_(gains)
        model.lm_head.weight.div_(gains)
    model.save_pretrained(path)


def all_slot_samples(model, ds: ExtractedDataset) -> list[Sample]:
    """The split's samples with every layer's output (as the probe set has), for drafts that
    are trained on other slots than the data records (the faults the doctor must find)."""
    slots = probe_slots(LAYERS)
    out = []
    for i in range(len(ds)):
        s = ds[i]
        got = hf.capture(model, s.input_ids[None], slots)
        out.append(Sample(s.sample_id, s.input_ids, s.loss_mask,
                          {slot.name: got[slot][0] for slot in slots}))
    return out


def train_draft(w, layout: HiddenStateLayout, iterations: int, samples=None, start=None):
    """A draft trained with ttt_loss on `layout`'s slots of the train split (from `start`'s
    weights if given); returns it and what training records, as eyas/train does: in-vocab
    accuracy per TTT step counted over the last epoch's batches while training (the
    draft config's eyas_extra entries)."""
    samples = samples or w.train_samples
    torch.manual_seed(0)
    draft = Eagle3Draft(w.draft_config, w.embed, w.vocab)
    if start is not None:  # no lm_head warm start: the target's is scaled by its uneven norm
        draft.load_state_dict(start.state_dict())
    opt = torch.optim.Adam([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    weights = decay_weights(STEPS, 0.8)
    gen = torch.Generator().manual_seed(0)
    last_epoch = iterations - len(samples) // 16
    counts = torch.zeros(STEPS, 2, dtype=torch.float64)  # [k, (correct, in_vocab)]
    for i in range(iterations):
        pick = torch.randperm(len(samples), generator=gen)[:16].tolist()
        result = ttt_loss(draft, collate([samples[i] for i in pick], layout), w.head, STEPS,
                          weights)
        if i >= last_epoch:
            counts += torch.tensor([[float(s.correct), float(s.in_vocab)] for s in result.steps],
                                   dtype=torch.float64)
        opt.zero_grad()
        result.loss.backward()
        opt.step()
    record = during_training_record(counts[:, 0].tolist(), counts[:, 1].tolist(),
                                    iterations - last_epoch, last_epoch + 1)
    return draft.eval(), record


def _build(base: Path) -> SimpleNamespace:
    started = time.perf_counter()
    target = make_tiny_target(base / "target", "llama", layers=LAYERS, hidden=HIDDEN)
    _train_target(target)
    prepare_tiny(base / "prepare", tiny_tokenizer(), 96, 24, rule_conversations)
    _extract(target, base / "prepare", base / "extract", slots=SLOTS, probe_samples=24)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    train = ExtractedDataset(base / "extract", "train")
    samples = [train[i] for i in range(len(train))]
    counts = count_tokens(((s.input_ids, s.loss_mask) for s in samples),
                          model.config.vocab_size)
    w = SimpleNamespace(base=base, target=target, model=model, layout=train.layout,
                        data=base / "extract", head=TargetHead.from_model(model),
                        embed=hf.decoder_parts(model)[0].weight,
                        vocab=build_vocab(counts, DRAFT_VOCAB), train_samples=samples)
    w.draft_config = DraftConfig.from_target(model.config, len(SLOTS), DRAFT_VOCAB)
    w.draft, w.record = train_draft(w, w.layout, iterations=150)
    w.reported = w.record[DURING_TRAINING]
    w.draft_dir = save_draft(w.draft, w.layout, w.vocab, base / "draft", extra=w.record)
    w.all_slots = all_slot_samples(model, train)
    w.seconds = time.perf_counter() - started
    return w


def world(tmp_path_factory) -> SimpleNamespace:
    """Built once per test session, whichever module asks first."""
    if "w" not in _WORLD:
        _WORLD["w"] = _build(tmp_path_factory.mktemp("eval-world"))
    return _WORLD["w"]


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    return world(tmp_path_factory)


# -- tests ------------------------------------------------------------------------------------

def test_predicted_tau_formula():
    assert predicted_tau([0.8, 0.5, 0.5]) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    assert predicted_tau([1.0, 1.0, 1.0]) == 4.0
    assert predicted_tau([0.0, 1.0]) == 1.0


def test_full_and_in_vocab_accuracy_count_what_training_counts(w):
    """The same alignment as eyas/draft/ttt.py: step stats of ttt_loss on the same batch, so
    what training counts while it trains and the standalone measurement are one metric."""
    batch = collate(w.train_samples, w.layout)
    with torch.no_grad():
        stats = ttt_loss(w.draft, batch, w.head, STEPS).steps
    counts = score_batch(w.draft, batch, w.head, STEPS)
    for k, (s, c) in enumerate(zip(stats, counts)):
        assert (c.counted, c.in_vocab, c.correct) == (int(s.positions), int(s.in_vocab),
                                                      int(s.correct)), k
    acc = evaluate_draft(w.draft, ExtractedDataset(w.data, "train"), w.head, STEPS,
                         batch_size=7)  # other batching, same numbers
    assert acc.in_vocab == pytest.approx([s.accuracy for s in stats], abs=1e-9)
    assert acc.samples == len(w.train_samples)


def test_conditional_accuracy_follows_each_chain():
    """Hand-made hits: rows are chains; conditional k counts rows alive after 0..k-1."""
    # 3 rows of a chain each, hits per position: row0 [1,1,0], row1 [1,0,1], row2 [0,1,1]
    acc = StepAccuracy([PositionCounts(3, 3, 2, 3, 2), PositionCounts(3, 3, 2, 2, 1),
                        PositionCounts(3, 3, 2, 1, 0)])
    assert acc.full == pytest.approx([2 / 3] * 3)
    assert acc.conditional == pytest.approx([2 / 3, 1 / 2, 0.0])
    assert acc.predicted_tau == pytest.approx(1 + 2 / 3 + 1 / 3)


def test_conditional_counts_on_real_rows_are_chains(w):
    acc = evaluate_draft(w.draft, ExtractedDataset(w.data, "heldout"), w.head, STEPS)
    p = acc.positions
    assert p[0].chain == p[0].counted and p[0].chain_correct == p[0].correct
    for k in range(1, STEPS):  # a chain at k is a row correct at every earlier position
        assert p[k].chain <= p[k - 1].chain_correct
        assert p[k].chain_correct <= min(p[k].chain, p[k].correct)
    assert 1.0 <= acc.predicted_tau <= 1 + STEPS
    assert acc.full[0] > 0.5  # a draft that learned something: the tests below rely on it


def test_a_draft_fed_the_wrong_slots_scores_lower(w):
    probe = ExtractedDataset(w.data, "probe")
    right = evaluate_draft(w.draft, probe, w.head, STEPS)

    def fed(*names):
        return evaluate_draft(w.draft, probe, w.head, STEPS,
                              layout=HiddenStateLayout.from_names(w.layout.target, list(names)))
    seeds_case = fed("block_out:1", "block_out:3", "block_out:5")  # embed missing
    shifted = fed("block_out:0", "block_out:2", "block_out:4")
    assert right.full[0] > seeds_case.full[0] + 0.3
    assert right.full[0] > shifted.full[0] + 0.05
    assert right.predicted_tau > shifted.predicted_tau > seeds_case.predicted_tau


def test_slots_a_split_does_not_store_are_named(w):
    other = HiddenStateLayout.from_names(w.layout.target, ["block_out:0", "block_out:2",
                                                           "block_out:4"])
    with pytest.raises(ValueError, match="block_out:0 is not stored.*only the probe split"):
        evaluate_draft(w.draft, ExtractedDataset(w.data, "train"), w.head, STEPS, layout=other)
    with pytest.raises(ValueError, match="at least one"):
        evaluate_draft(w.draft, ExtractedDataset(w.data, "train"), w.head, 0)
