"""The gap alarm: a draft that scores less on its own training shards than training measured.

Such a gap is how a draft trained on other tensors than its data records shows up (e.g. 74.7%
in-vocab accuracy measured during training, 34.1% measured standalone on the same shards). A
gap beyond the tolerance is not logged and forgotten: it is a finding of the doctor's verdict,
and the evaluate stage raises it as `SkewAlarm` (eyas/doctor/verdict.py) with the verdict,
which says what the evidence points to.

The two sides must come from different paths, or the alarm can never fire: the reported side is
what the trainer saw WHILE training (eyas/train accumulates the in-vocab accuracy per TTT step
over its last epoch's batches, the inputs as its own data path assembled them), or what another
trainer logged, or a figure the user gives; the measured side is the evaluator's standalone run
of the final weights over the training shards as the layout says to read them. Both are in-vocab
accuracy (`StepStats.accuracy`: correct among rows whose target token the draft vocab holds).

The check is one-sided: the running figure scored each batch with the weights of that step, so
it lags the final weights and is normally at or below the standalone one. Only a shortfall of
the standalone measurement beyond the tolerance is a fault.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from eyas.doctor.findings import Finding, accuracies
from eyas.draft.accuracy import DURING_TRAINING, DURING_TRAINING_COVERS, StepAccuracy

NOT_CHECKED = "not checked: no reported accuracy (pass --reported-accuracy)"


@dataclass(frozen=True)
class ReportedAccuracy:
    """What a trainer measured on its training data, per draft position, and where from."""

    values: list[float]
    source: str  # in words, for the finding: "measured during training over ..."

    @classmethod
    def given(cls, values, how: str = "as given to the doctor") -> "ReportedAccuracy":
        return cls(as_list(values), how)


def recorded_accuracy(extra: Mapping) -> tuple[ReportedAccuracy | None, str]:
    """(training's during-training accuracy from a draft config's eyas_extra, or None and why
    there is none)."""
    values = extra.get(DURING_TRAINING)
    if values:
        covers = extra.get(DURING_TRAINING_COVERS) or {}
        tokens = covers.get("scored_tokens") or []
        span = (f", {covers['steps']} steps and {tokens[0]} scored tokens at position 1"
                if "steps" in covers and tokens else "")
        return (ReportedAccuracy(as_list(values), "measured during training over its last "
                                 f"epoch{span}, config.json eyas_extra.{DURING_TRAINING}"), "")
    return None, (f"its config.json has no eyas_extra.{DURING_TRAINING} (a draft from another "
                  "trainer, or saved without it)")


def as_list(reported: Sequence[float] | Mapping) -> list[float]:
    """[a0, a1, ...] from a list, or from {0: a0, "1": a1} / {"acc_step0": a0} keys."""
    if isinstance(reported, ReportedAccuracy):
        return list(reported.values)
    if isinstance(reported, Mapping):
        def position(key) -> int:  # the key's trailing digits: 0, "1", "acc_step2"
            digits = re.search(r"(\d+)$", str(key))
            if digits is None:
                raise ValueError(f"reported accuracy key {key!r} names no position")
            return int(digits.group(1))
        return [float(v) for _, v in sorted(reported.items(), key=lambda kv: position(kv[0]))]
    return [float(v) for v in reported]


_UNEXPLAINED = (
    "The probe evidence fits the layout the draft records, so the layout is not what differs: "
    "the tensors training read are not the ones in these training shards (shards re-extracted "
    "or overwritten since training, another run's data, or a trainer that assembled its inputs "
    "otherwise than the layout says). Re-extract and retrain, or evaluate on the data the "
    "draft was trained on")


def accuracy_gap(measured: StepAccuracy, reported, tolerance: float,
                 explained: bool = True) -> Finding | None:
    """An "accuracy_gap" finding when any position falls short of training by > tolerance.
    `explained=False`: no other finding accounts for it, and the message says what is left."""
    want = as_list(reported)
    source = reported.source if isinstance(reported, ReportedAccuracy) else "training"
    have = measured.in_vocab
    n = min(len(want), len(have))
    gaps = [want[k] - have[k] for k in range(n)]
    if not gaps or max(gaps) <= tolerance:
        return None
    worst = max(range(n), key=lambda k: gaps[k])
    why = (_UNEXPLAINED if not explained else
           "The draft was trained on other tensors than the data says; the other findings "
           "name which")
    return Finding("accuracy_gap", (
        f"on its own training shards the draft scores {accuracies(have[:n])} per position "
        f"(in-vocab, standalone), but training reported {accuracies(want[:n])} ({source}): position "
        f"{worst + 1} falls short by {gaps[worst]:.3f} (tolerance {tolerance}). {why}"))
