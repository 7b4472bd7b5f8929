"""What the train stage reports, typed once for its writer and its readers.

    run_dir/train/train_report.json  `TrainReport`: what eyas.train.loop.train_draft returns and
                                     writes on rank 0; workflows/reports.py logs it
    run_dir/train/stream.json        `FeederReport` (online runs): how tasks/online.py's Feeder
                                     delivered the stream; workflows/stages.py writes it,
                                     workflows/reports.py logs it

Each carries its eyas_format; one of another version is refused (eyas.files.JsonReport).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from eyas.files import JsonReport

TRAIN_REPORT_FILE = "train_report.json"
FEEDER_REPORT_FILE = "stream.json"


@dataclass
class StreamNorms:
    """Online: the per-slot norm fingerprints of the first epoch's streamed samples, summed over
    every rank (offline, the extraction's manifest holds them)."""

    norms: dict[str, list[float]] = field(default_factory=dict)  # slot -> [mean, std]
    norm_tokens: int = 0  # the tokens they cover
    received_steps: int = 0  # the steps rank 0 received


@dataclass
class TrainReport(JsonReport):
    """One training run (or, stopped early with `stop_after`, its part so far)."""

    FILE: ClassVar[str] = TRAIN_REPORT_FILE

    draft_dir: str
    steps: int
    resumed_from: int | None
    losses: list[float] = field(default_factory=list)  # per global step, this run's steps
    # in-vocab accuracy per TTT step as measured WHILE training, over the last epoch's batches
    # (each scored with its step's weights; counts summed over ranks and steps): what the
    # evaluate stage's gap alarm holds the standalone measurement to
    train_accuracy: list[float] = field(default_factory=list)
    train_accuracy_steps: int = 0  # the optimizer steps it covers
    train_accuracy_tokens: list[int] = field(default_factory=list)  # in-vocab rows, per step
    # standalone (eyas.draft.accuracy.evaluate_draft) on the held-out split, final weights
    heldout_accuracy: list[float] = field(default_factory=list)
    heldout_full_accuracy: list[float] = field(default_factory=list)
    tokens_per_s: float = 0.0
    stream: StreamNorms | None = None  # online runs only: what the stream delivered
    precision: str = "float32"  # what the draft's matmuls computed in (train.precision resolved)

    @property
    def online(self) -> bool:
        return self.stream is not None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainReport":
        stream = data["stream"]
        return cls(**{**data, "stream": StreamNorms(**stream) if stream is not None else None})




@dataclass
class FeederReport(JsonReport):
    """How an online run's stream was fed: optimizer steps the target replicas computed, steps
    reused from the kept first epoch, the most steps ever queued ahead of training, and how
    often a restarted worker group (a trainer's node lost) rewound the stream."""

    FILE: ClassVar[str] = FEEDER_REPORT_FILE

    computed_steps: int = 0
    reused_steps: int = 0
    most_queued: int = 0
    queue_steps: int = 0  # train.online.queue_steps: the bound on `most_queued`
    keep_epoch: bool = False  # train.online.keep_epoch
    replicas: int = 0
    rewinds: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "FeederReport":
        return cls(**{f.name: data[f.name] for f in fields(cls)})

