"""The gap alarm (training's accuracy not reproduced) and the evaluate stage's report."""
from __future__ import annotations

import json

import pytest

from eyas.doctor import Diagnosis, ReportedAccuracy, SkewAlarm, diagnose
from eyas.doctor.fingerprints import HandedFeatures
from eyas.doctor.gap import accuracy_gap, as_list
from eyas.evaluate import evaluate_draft
from eyas.evaluate.measured import heldout_prompts, measure_tau
from eyas.evaluate.report import EvaluateReport
from eyas.store.reader import ExtractedDataset
from world import STEPS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def train_acc(trained_world):
    return evaluate_draft(trained_world.draft, ExtractedDataset(trained_world.data, "train"), trained_world.head, STEPS)


def test_reported_accuracy_keys():
    assert as_list([0.5, 0.4]) == [0.5, 0.4]
    assert as_list({"acc_step1": 0.4, "acc_step0": 0.5}) == [0.5, 0.4]
    assert as_list({1: 0.4, "0": 0.5}) == [0.5, 0.4]
    with pytest.raises(ValueError, match="names no position"):
        as_list({"first": 0.5})


def test_reproduced_training_accuracy_raises_nothing(trained_world, train_acc):
    verdict = diagnose(Diagnosis(trained_world.draft, trained_world.layout, trained_world.data,
                                 target_head=trained_world.head, steps=STEPS,
                                 reported=ReportedAccuracy.given(trained_world.reported),
                                 train_accuracy=train_acc))
    assert verdict.ok and "accuracy_gap" not in verdict.names, verdict.explain()
    assert accuracy_gap(train_acc, [a + 0.04 for a in trained_world.reported], 0.05) is None


def test_a_gap_raises_the_alarm_with_the_doctors_verdict(trained_world, train_acc):
    inflated = {f"acc_step{k}": min(1.0, a + 0.2) for k, a in enumerate(train_acc.in_vocab)}
    verdict = diagnose(Diagnosis(trained_world.draft, trained_world.layout, trained_world.data,
                                 target_head=trained_world.head, steps=STEPS,
                                 reported=ReportedAccuracy.given(inflated),
                                 train_accuracy=train_acc))
    assert verdict.names[0] == "accuracy_gap" and not verdict.ok
    alarm = str(SkewAlarm(verdict))
    assert "falls short by" in alarm and "evidence:" in alarm
    assert verdict.best_layout == trained_world.layout  # here the layout is not what is wrong


def test_report_has_accuracy_taus_and_verdict(trained_world, train_acc):
    heldout = evaluate_draft(trained_world.draft, ExtractedDataset(trained_world.data, "heldout"), trained_world.head, STEPS)
    prompts = heldout_prompts(ExtractedDataset(trained_world.data, "heldout"), 2)
    measured = measure_tau(trained_world.model, trained_world.draft, trained_world.layout, prompts, STEPS, 6)
    probe = ExtractedDataset(trained_world.data, "probe")
    verdict = diagnose(Diagnosis(trained_world.draft, trained_world.layout, trained_world.data,
                                 target_head=trained_world.head, steps=STEPS,
                                 features=HandedFeatures([probe[0].slots[n] for n in
                                                          trained_world.layout.names])))
    report = json.loads(json.dumps(EvaluateReport.build(train_acc, heldout, verdict, measured,
                                                        trained_world.reported).to_dict()))
    per = report["per_position_accuracy"]
    for split in ("train", "heldout"):
        assert len(per[split]["full"]) == len(per[split]["conditional"]) == STEPS
    assert report["predicted_tau"]["heldout"] == pytest.approx(heldout.predicted_tau)
    assert report["measured_tau"] == pytest.approx(measured.tau) and report["measured_tau"] > 1
    assert report["doctor"]["ok"] and report["reported_train_accuracy"] == trained_world.reported
    assert len(verdict.probe_norms) == 8  # embed, 6 blocks, norm
