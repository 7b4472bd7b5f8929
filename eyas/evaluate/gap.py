"""The gap alarm: a draft that scores less on its own training shards than training reported.

That gap is the seeds' symptom (74.7% reported in training, 34.1% measured standalone): the
draft was trained on other tensors than the data it is judged on says. A gap beyond the
tolerance is not logged and forgotten: it raises `SkewAlarm` carrying the skew doctor's verdict,
which says what the evidence points to.

Training reports the in-vocab accuracy per TTT step (`StepStats.accuracy`: correct among rows
whose target token the draft vocab holds), so that is what is compared here.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from eyas.evaluate.standalone import StepAccuracy

if TYPE_CHECKING:
    from eyas.evaluate.doctor import Finding, Verdict


class SkewAlarm(RuntimeError):
    """Train/serve (or train/evaluate) skew found; `.verdict` is the doctor's diagnosis."""

    def __init__(self, verdict: "Verdict"):
        self.verdict = verdict
        super().__init__(verdict.explain())

    @classmethod
    def raise_for(cls, verdict: "Verdict") -> None:
        if not verdict.ok:
            raise cls(verdict)


def as_list(reported: Sequence[float] | Mapping) -> list[float]:
    """[a0, a1, ...] from a list, or from {0: a0, "1": a1} / {"acc_step0": a0} keys."""
    if isinstance(reported, Mapping):
        def position(key) -> int:  # the key's trailing digits: 0, "1", "acc_step2"
            digits = re.search(r"(\d+)$", str(key))
            if digits is None:
                raise ValueError(f"reported accuracy key {key!r} names no position")
            return int(digits.group(1))
        return [float(v) for _, v in sorted(reported.items(), key=lambda kv: position(kv[0]))]
    return [float(v) for v in reported]


def accuracy_gap(measured: StepAccuracy, reported, tolerance: float) -> "Finding | None":
    """An "accuracy_gap" finding when any position falls short of training by > tolerance."""
    from eyas.evaluate.doctor import Finding

    want = as_list(reported)
    have = measured.in_vocab
    n = min(len(want), len(have))
    gaps = [want[k] - have[k] for k in range(n)]
    if not gaps or max(gaps) <= tolerance:
        return None
    worst = max(range(n), key=lambda k: gaps[k])
    return Finding("accuracy_gap", (
        f"on its own training shards the draft scores {fmt(have[:n])} per position, but "
        f"training reported {fmt(want[:n])}: position {worst + 1} falls short by "
        f"{gaps[worst]:.3f} (tolerance {tolerance}). The draft was trained on other tensors "
        "than the data says; the other findings name which"))


def check_training_gap(measured: StepAccuracy, reported, tolerance: float,
                       diagnose: Callable[[], "Verdict"]) -> None:
    """Raise SkewAlarm with the doctor's verdict (run only then) if training's numbers are not
    reproduced on the training shards."""
    finding = accuracy_gap(measured, reported, tolerance)
    if finding is None:
        return
    verdict = diagnose()
    if "accuracy_gap" not in verdict.names:
        verdict.findings.insert(0, finding)
    raise SkewAlarm(verdict)


def fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"
