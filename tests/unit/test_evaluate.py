"""Standalone evaluation: alignment with training, conditional accuracy, predicted tau (on
the session's `trained_world`, tests/conftest.py)."""
from __future__ import annotations


import pytest
import torch

from eyas.draft.ttt import ttt_loss
from eyas.draft.accuracy import (PositionCounts, StepAccuracy, collate, evaluate_draft,
                                      predicted_tau, score_batch)
from eyas.store.reader import ExtractedDataset
from eyas.layout import HiddenStateLayout
from world import STEPS

pytestmark = pytest.mark.usefixtures("one_thread")

# -- tests ------------------------------------------------------------------------------------

def test_predicted_tau_formula():
    assert predicted_tau([0.8, 0.5, 0.5]) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    assert predicted_tau([1.0, 1.0, 1.0]) == 4.0
    assert predicted_tau([0.0, 1.0]) == 1.0


def test_full_and_in_vocab_accuracy_count_what_training_counts(trained_world):
    """The same alignment as eyas/draft/ttt.py: step stats of ttt_loss on the same batch, so
    what training counts while it trains and the standalone measurement are one metric."""
    batch = collate(trained_world.train_samples, trained_world.layout)
    with torch.no_grad():
        stats = ttt_loss(trained_world.draft, batch, trained_world.head, STEPS).steps
    counts = score_batch(trained_world.draft, batch, trained_world.head, STEPS)
    for k, (s, c) in enumerate(zip(stats, counts)):
        assert (c.counted, c.in_vocab, c.correct) == (int(s.positions), int(s.in_vocab),
                                                      int(s.correct)), k
    acc = evaluate_draft(trained_world.draft, ExtractedDataset(trained_world.data, "train"), trained_world.head, STEPS,
                         batch_size=7)  # other batching, same numbers
    assert acc.in_vocab == pytest.approx([s.accuracy for s in stats], abs=1e-9)
    assert acc.samples == len(trained_world.train_samples)


def test_conditional_accuracy_follows_each_chain():
    """Hand-made hits: rows are chains; conditional k counts rows alive after 0..k-1."""
    # 3 rows of a chain each, hits per position: row0 [1,1,0], row1 [1,0,1], row2 [0,1,1]
    acc = StepAccuracy([PositionCounts(3, 3, 2, 3, 2), PositionCounts(3, 3, 2, 2, 1),
                        PositionCounts(3, 3, 2, 1, 0)])
    assert acc.full == pytest.approx([2 / 3] * 3)
    assert acc.conditional == pytest.approx([2 / 3, 1 / 2, 0.0])
    assert acc.predicted_tau == pytest.approx(1 + 2 / 3 + 1 / 3)


def test_conditional_counts_on_real_rows_are_chains(trained_world):
    acc = evaluate_draft(trained_world.draft, ExtractedDataset(trained_world.data, "heldout"), trained_world.head, STEPS)
    p = acc.positions
    assert p[0].chain == p[0].counted and p[0].chain_correct == p[0].correct
    for k in range(1, STEPS):  # a chain at k is a row correct at every earlier position
        assert p[k].chain <= p[k - 1].chain_correct
        assert p[k].chain_correct <= min(p[k].chain, p[k].correct)
    assert 1.0 <= acc.predicted_tau <= 1 + STEPS
    assert acc.full[0] > 0.5  # a draft that learned something: the tests below rely on it


def test_a_draft_fed_the_wrong_slots_scores_lower(trained_world):
    probe = ExtractedDataset(trained_world.data, "probe")
    right = evaluate_draft(trained_world.draft, probe, trained_world.head, STEPS)

    def fed(*names):
        return evaluate_draft(trained_world.draft, probe, trained_world.head, STEPS,
                              layout=HiddenStateLayout.from_names(trained_world.layout.target, list(names)))
    seeds_case = fed("block_out:1", "block_out:3", "block_out:5")  # embed missing
    shifted = fed("block_out:0", "block_out:2", "block_out:4")
    assert right.full[0] > seeds_case.full[0] + 0.3
    assert right.full[0] > shifted.full[0] + 0.05
    assert right.predicted_tau > shifted.predicted_tau > seeds_case.predicted_tau


def test_slots_a_split_does_not_store_are_named(trained_world):
    other = HiddenStateLayout.from_names(trained_world.layout.target, ["block_out:0", "block_out:2",
                                                           "block_out:4"])
    with pytest.raises(ValueError, match="block_out:0 is not stored.*only the probe split"):
        evaluate_draft(trained_world.draft, ExtractedDataset(trained_world.data, "train"), trained_world.head, STEPS, layout=other)
    with pytest.raises(ValueError, match="at least one"):
        evaluate_draft(trained_world.draft, ExtractedDataset(trained_world.data, "train"), trained_world.head, 0)


def test_evaluate_writes_the_speculation_profiles(trained_world, tmp_path):
    """The held-out profile holds the counters the report measured; a prompt set's chats are
    replayed turn by turn (one request per turn) into a profile of their own."""
    import json

    from eyas.config import EvalConfig
    from eyas.conversations.prompt_sets import Conversation, PromptSet
    from eyas.doctor.profile import read_profile, stats_from_profile
    from eyas.evaluate.report import EvaluateReport
    from eyas.evaluate.run import evaluate_run

    w = trained_world
    chats = PromptSet("chat", "chat.jsonl", (Conversation(turns=("ABQRST", "CDEFGH")),
                                             Conversation(turns=("XYZABC",)),
                                             Conversation(turns=("NOT", "READ"))))
    report = evaluate_run(w.data, w.draft_dir, w.target,
                          EvalConfig(num_prompts=2, max_new_tokens=8), tmp_path, steps=STEPS,
                          prompt_sets=[chats])
    assert report["profiles"] == {"heldout": "speculation_profile.json",
                                  "chat": "speculation_profile.chat.json"}
    heldout = read_profile(tmp_path / "speculation_profile.json")
    measured = stats_from_profile(heldout)
    assert (measured.drafts, measured.accepted, list(measured.accepted_per_position)) == (
        report["measured"]["drafts"], report["measured"]["accepted"],
        report["measured"]["accepted_per_position"])
    assert heldout["mean_accept_length"] == pytest.approx(report["measured_tau"], abs=1e-6)
    assert heldout["measurement_conditions"]["dataset"] == "heldout"
    assert heldout["method"] == "eagle3" and heldout["num_speculative_tokens"] == STEPS
    chat = read_profile(tmp_path / "speculation_profile.chat.json")
    assert chat["measurement_conditions"]["requests"] == 3  # 2 + 1 turns of the first two
    assert chat["measurement_conditions"]["source"] == "chat.jsonl"
    assert EvaluateReport.read(tmp_path).profiles == report["profiles"]


def test_evaluate_rescores_only_the_first_max_samples(trained_world):
    """eval.max_train_samples: the training side is rescored on the first samples alone (at
    users' scale every sample rescored on the stage's CPU took weeks); none past them is
    read."""
    ds = ExtractedDataset(trained_world.data, "train")
    read = []

    class Watched:
        layout = ds.layout

        def __len__(self):
            return len(ds)

        def lengths(self):
            return ds.lengths()

        def __getitem__(self, i):
            read.append(i)
            return ds[i]

    acc = evaluate_draft(trained_world.draft, Watched(), trained_world.head, STEPS,
                         max_samples=3)
    assert acc.samples == 3 and sorted(read) == [0, 1, 2] and len(ds) > 3
