"""What the evaluate stage writes: run_dir/evaluate/report.json, an `EvaluateReport` (its
figures are drawn from it by workflows/plots.py). eyas.evaluate.run writes it,
workflows/reports.py reads it back (a report of another eyas_format is refused,
eyas.files.JsonReport):

    {"per_position_accuracy": {"train": {full, in_vocab, conditional, ...},
                               "heldout": {...}},
     "predicted_tau": {"train": 2.9, "heldout": 2.6},  # from heldout's conditional accuracy
     "measured_tau": 2.5, "measured": {counters of real speculative decoding},
     "reported_train_accuracy": [...],                  # what training measured while it
     "reported_train_accuracy_source": "measured ...",  # trained, when known, and from where
     "doctor": {ok, findings, best_layout, table, ...},
     "prompts": 16, "explain": "the doctor's verdict in words",
     "profiles": {"heldout": "speculation_profile.json",   # the speculation profiles
                  "code": "speculation_profile.code.json"}}  # beside it, per prompt set
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from eyas.files import JsonReport
from eyas.doctor.verdict import Verdict
from eyas.doctor.gap import as_list
from eyas.draft.accuracy import StepAccuracy
from eyas.acceptance import AcceptanceStats


REPORT_FILE = "report.json"


@dataclass(frozen=True)
class SplitAccuracy:
    """Per-position accuracy over one split, as stored (eyas.draft.accuracy.StepAccuracy)."""

    full: list[float]
    in_vocab: list[float]
    conditional: list[float]
    predicted_tau: float
    samples: int
    counted: list[int]

    @classmethod
    def of(cls, accuracy: StepAccuracy) -> "SplitAccuracy":
        return cls(**accuracy.to_dict())


@dataclass(frozen=True)
class DoctorSummary:
    """What the stage reads of the doctor's verdict (stored whole: Verdict.to_dict)."""

    ok: bool
    status: str  # OK | INCONCLUSIVE | FAULT (...)
    inconclusive: str  # why the evidence does not decide; "" when it does
    findings: list[str]  # the findings' names
    probe_norms: dict[str, list[float]]  # slot -> [mean, std] on the probe set


@dataclass
class EvaluateReport(JsonReport):
    FILE: ClassVar[str] = REPORT_FILE
    train: SplitAccuracy  # standalone, on the training split
    heldout: SplitAccuracy
    measured_tau: float | None  # real speculative decoding with the reference engine
    measured: dict | None  # its counters (eyas.acceptance.AcceptanceStats.to_dict)
    reported_train_accuracy: list[float] | None  # what training measured while it trained
    reported_train_accuracy_source: str | None
    doctor: dict = field(default_factory=dict)  # the verdict (the doctor's Verdict.to_dict)
    prompts: int | None = None  # held-out prompts measured_tau decoded
    explain: str | None = None  # the verdict in words
    profiles: dict[str, str] | None = None  # prompt set -> its speculation profile's file name

    @classmethod
    def build(cls, train: StepAccuracy, heldout: StepAccuracy, verdict: Verdict,
              measured: AcceptanceStats | None = None, reported=None,
              prompts: int | None = None, profiles: dict | None = None) -> "EvaluateReport":
        return cls(SplitAccuracy.of(train), SplitAccuracy.of(heldout),
                   measured.tau if measured else None,
                   measured.to_dict() if measured else None,
                   as_list(reported) if reported is not None else None,
                   getattr(reported, "source", "given") if reported is not None else None,
                   verdict.to_dict(), prompts, verdict.explain(), profiles)

    @property
    def predicted_tau(self) -> float:
        """From the held-out split's conditional accuracy."""
        return self.heldout.predicted_tau

    @property
    def verdict(self) -> DoctorSummary:
        d = self.doctor
        return DoctorSummary(d["ok"], d["status"], d.get("inconclusive") or "",
                             [f["name"] for f in d["findings"]], d.get("probe_norms") or {})

    def to_dict(self) -> dict:
        out = {"per_position_accuracy": {"train": asdict(self.train),
                                         "heldout": asdict(self.heldout)},
               "predicted_tau": {"train": self.train.predicted_tau,
                                 "heldout": self.heldout.predicted_tau},
               **{f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in ("train", "heldout")}}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "EvaluateReport":
        per = data["per_position_accuracy"]
        return cls(SplitAccuracy(**per["train"]), SplitAccuracy(**per["heldout"]),
                   **{f.name: data[f.name] for f in fields(cls)
                      if f.name not in ("train", "heldout")})


