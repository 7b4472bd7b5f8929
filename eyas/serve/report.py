"""What the serve stage writes: run_dir/serve/report.json, a `ServeReport`. eyas.serve.run
writes it (also when the doctor refuses the draft or parity fails: then without the benchmark),
workflows/serve_reports.py reads it back (a report of another eyas_format is refused,
eyas.files.JsonReport):

    {"engine", "draft", "served", "parity", "parity_detail", "doctor", "forced",
     then, when benchmarked: "engine_version", "prompts", ..., "sweep", "boot_s",
     "prompt_sets"; "gap" when the gap alarm compared profiles; "diagnosis" of the served
     draft when benchmarked}
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from eyas.files import JsonReport

REPORT_FILE = "report.json"


@dataclass(frozen=True)
class SweepPoint:
    """One concurrency level, plain vs speculative (eyas.serve.latency.compare's numbers)."""

    concurrency: int
    tau: float | None
    per_position_acceptance: list[float] | None
    time_per_token_ms_spec: float
    time_per_token_ms_plain: float
    ratio: float | None  # speculative / plain time per output token
    tokens_per_s_spec: float
    tokens_per_s_plain: float
    # greedy outputs identical with and without the draft, or parting only at near-ties of
    # the target's (eyas.serve.lossless; `partings` lists each, judged)
    lossless: bool
    requests: int
    # vLLM bench serve's names (eyas.serve.latency): latency_metrics with and without the
    # draft, spec_decode_metrics
    with_draft: dict | None = None
    without_draft: dict | None = None
    spec_decode: dict | None = None
    partings: list[dict] | None = None
    # the ratio's 95 % interval from the requests' paired times (eyas.serve.latency
    # .ratio_interval); interleaved: served A/B/B/A by two engines alive together
    ratio_interval: list[float] | None = None
    interleaved: bool = False


@dataclass(frozen=True)
class SetResult:
    """One prompt set's benchmark (eyas.conversations.prompt_sets): the held-out split first."""

    name: str
    source: str
    conversations: int  # at concurrency 1 (a multi-turn chat is several requests)
    sweep: list[SweepPoint]
    acceptance: dict  # eyas.acceptance.AcceptanceStats.to_dict at concurrency 1
    profile: str  # its served speculation profile, beside the report

    @classmethod
    def from_dict(cls, data: dict) -> "SetResult":
        return cls(**{**data, "sweep": [SweepPoint(**p) for p in data["sweep"]]})


@dataclass
class ServeBenchmark:
    """The benchmark: concurrency 1 (the headline) and the sweep over serve.concurrency."""

    engine_version: str
    prompts: int
    num_speculative_tokens: int
    max_new_tokens: int
    tau: float | None
    per_position_acceptance: list[float] | None
    acceptance: dict  # eyas.acceptance.AcceptanceStats.to_dict at concurrency 1
    time_per_token_ms_spec: float
    time_per_token_ms_plain: float
    latency_ratio: float | None
    speedup: float
    tokens_per_s_spec: float
    tokens_per_s_plain: float
    lossless: bool  # at every level
    sweep: list[SweepPoint] = field(default_factory=list)
    boot_s: dict | None = None  # engine boot seconds, plain and speculative (vLLM)
    prompt_sets: list[SetResult] = field(default_factory=list)  # the held-out split first

    @classmethod
    def from_dict(cls, data: dict) -> "ServeBenchmark":
        values = {f.name: data[f.name] for f in fields(cls)}
        values["sweep"] = [SweepPoint(**p) for p in values["sweep"]]
        values["prompt_sets"] = [SetResult.from_dict(r) for r in values["prompt_sets"]]
        return cls(**values)


@dataclass
class ServeReport(JsonReport):
    FILE: ClassVar[str] = REPORT_FILE
    engine: str  # serve.engine
    draft: str  # the draft asked for (serve.draft or the run's)
    parity: bool | None  # None: not applicable to this engine, or never checked (refused)
    doctor: dict  # the doctor's preflight: format, says, engine, findings
    forced: bool  # benchmarked despite a failed parity (serve.force)
    served: str | None = None  # the directory the engine booted with (None: refused first)
    parity_detail: dict | None = None  # eyas.serve.parity.check_parity's record
    benchmark: ServeBenchmark | None = None  # None: stopped before benchmarking
    # the gap alarm: served against offline profiles per position and set (None: no offline)
    gap: dict | None = None
    # findings on the served draft itself (eyas.serve.run.contributes_nothing); None: not
    # benchmarked
    diagnosis: list[dict] | None = None

    @property
    def refused(self) -> bool:
        """Refused by the doctor's checks before parity was checked."""
        return bool(self.doctor.get("findings")) and self.parity_detail is None

    def to_dict(self) -> dict:
        out = {"engine": self.engine, "draft": self.draft}
        if self.served is not None:
            out["served"] = self.served
        out["parity"] = self.parity
        if self.parity_detail is not None:
            out["parity_detail"] = self.parity_detail
        out.update(doctor=self.doctor, forced=self.forced)
        if self.benchmark is not None:
            out.update(asdict(self.benchmark))
        if self.gap is not None:
            out["gap"] = self.gap
        if self.diagnosis is not None:
            out["diagnosis"] = self.diagnosis
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ServeReport":
        return cls(data["engine"], data["draft"], data["parity"], data["doctor"],
                   data["forced"], data.get("served"), data.get("parity_detail"),
                   ServeBenchmark.from_dict(data) if "engine_version" in data else None,
                   data.get("gap"), data.get("diagnosis"))


