"""The stages' reports: what each stage measured, typed, under the names MLflow knows it by
(metrics, tags, artifacts), with its rows of the end-of-run summary and its part of the parent
run's summary row. workflows/stages.py builds one per stage from what the stage's Ray work
returned and wrote; `log_report` logs any of them to the stage's run. The MLflow names live
here only, and for what a served benchmark logs (the serve stage and `eyas compare`) in
workflows/serve_reports.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

from eyas.evaluate.report import REPORT_FILE as EVALUATE_FILE, EvaluateReport
from eyas.layout import TargetIdentity
from eyas.train.report import FEEDER_REPORT_FILE, TRAIN_REPORT_FILE, FeederReport, TrainReport
from workflows.tracking import Tracking

TARGET_METRICS = ("heldout_loss", "unigram_loss", "num_parameters", "build_seconds")


@dataclass(frozen=True)
class Artifact:
    """One artifact of a stage's run: a file logged into the folder `where`, or a text, a JSON
    document or a figure logged as the path `where`. A figure's payload draws it, so
    matplotlib is imported only when it is logged."""

    kind: Literal["file", "text", "json", "figure"]
    payload: object
    where: str


class StageReport:
    """What a stage logs and says; each stage's report overrides the parts it has."""

    def metrics(self) -> dict[str, float]:
        return {}

    def tags(self) -> dict[str, str]:
        return {}

    def artifacts(self) -> list[Artifact]:
        return []

    def rows(self) -> dict[str, str]:
        """Its rows of the end-of-run summary."""
        return {}

    def results(self) -> dict[str, float]:
        """Its part of the parent run's summary row (logged there as summary.NAME)."""
        return {}


def log_report(t: Tracking, report: StageReport) -> dict:
    """Log a stage's report to the current run (its tags, metrics and artifacts); returns its
    rows of the end-of-run summary."""
    tags = report.tags()
    if tags:
        t.set_tags(tags)
    t.log_metrics(report.metrics())
    log = {"file": t.log_file, "text": t.log_text, "json": t.log_json,
           "figure": lambda draw, where: t.log_figure(draw(), where)}
    for a in report.artifacts():
        log[a.kind](a.payload, a.where)
    return report.rows()


def _norm_metrics(norms: dict[str, list[float]], prefix: str) -> dict[str, float]:
    return {f"{prefix}norm.{slot}.{stat}": value for slot, (mean, std) in norms.items()
            for stat, value in (("mean", mean), ("std", std))}


def _norm_figure(norms: dict[str, list[float]], title: str) -> Callable[[], object]:
    def draw():
        from workflows.plots import norm_fingerprints
        return norm_fingerprints(norms, title)
    return draw


def two_places(values) -> str:
    """Per-position accuracies as the summary table shows them: "0.46 0.44 0.41"."""
    return " ".join(f"{v:.2f}" for v in values)


@dataclass
class PrepareStageReport(StageReport):
    manifest: dict  # prepare/manifest.json
    build_report: dict | None  # the built-in target's build (eyas.targets); None: given one
    identity: TargetIdentity
    target_path: str
    files: tuple[Path, ...]  # the manifest and the target record, logged under prepare/

    def metrics(self) -> dict[str, float]:
        out = {}
        for split, stats in self.manifest["splits"].items():
            out.update({f"{split}.{k}": v for k, v in stats.items() if not isinstance(v, dict)})
            out.update({f"{split}.skipped.{reason}": n
                        for reason, n in (stats.get("skipped") or {}).items()})
        build = self.build_report or {}
        return {**out, **{f"target.{k}": build[k] for k in TARGET_METRICS if k in build}}

    def tags(self) -> dict[str, str]:
        return {"eyas.target_fingerprint": self.identity.fingerprint,
                "eyas.target_path": self.target_path}

    def artifacts(self) -> list[Artifact]:
        built = [Artifact("json", self.build_report, "target/eyas_build.json")]
        return (built if self.build_report else []) + [
            Artifact("file", path, "prepare") for path in self.files]

    def rows(self) -> dict[str, str]:
        rows = {split: f"{stats.get('samples')} samples, {stats.get('tokens')} tokens"
                for split, stats in self.manifest["splits"].items()}
        report = self.build_report
        if report:
            rows["target"] = (
                f"{report['packaged']}, {report['num_parameters'] / 1e6:.1f}M params in "
                f"{report['dtype']}, converted from {Path(report['source']).name}"
                if "packaged" in report else
                f"held-out loss {report['heldout_loss']:.3f} vs unigram "
                f"{report['unigram_loss']:.3f} nats/token, "
                f"{report['num_parameters'] / 1e6:.2f}M params")
        return rows


@dataclass
class ExtractStageReport(StageReport):
    manifest: dict  # tasks.extract.run_extraction's: the stored manifest and the run's rates
    layout: str  # the layout described: the norm figure's title
    source: str  # train.source
    out: Path

    def metrics(self) -> dict[str, float]:
        m = self.manifest
        bare = m.get("bare_forward_tokens_per_s")
        # the target's forward alone, same batches: the ceiling extraction is held to
        ceiling = {"bare_forward_tokens_per_s": bare,
                   "of_bare_forward": m["tokens_per_s"] / bare} if bare else {}
        return {**ceiling, "tokens_per_s": m["tokens_per_s"], "bytes": m["bytes"],
                "tensor_bytes": m["tensor_bytes"], "shards": len(m["shards"]),
                "resumed_shards": m["resumed_shards"],
                "bytes_over_raw": m["bytes"] / max(1, m["tensor_bytes"]),
                **{f"{split}.{k}": v for split, tot in m["totals"].items()
                   for k, v in tot.items()},
                **_norm_metrics(m["layout"]["norms"], "")}

    def tags(self) -> dict[str, str]:
        return {"eyas.source": self.source}

    def artifacts(self) -> list[Artifact]:
        return [Artifact("figure", _norm_figure(self.manifest["layout"]["norms"], self.layout),
                         "extract/norm_fingerprints.png"),
                Artifact("json", self.manifest["layout"], "extract/layout.json"),
                Artifact("file", self.out / "manifest.json", "extract")]

    def rows(self) -> dict[str, str]:
        m = self.manifest
        norms = ", ".join(f"{k} {v[0]:.3g}" for k, v in m["layout"]["norms"].items())
        if self.source == "online":
            return {"data": "online: the probe set and held-out split only "
                            f"({m['totals']['train']['samples']} "
                            "train samples are streamed from the target while training)",
                    "norms": f"probe {norms}"}
        bare = m.get("bare_forward_tokens_per_s")
        return {"data": f"{len(m['shards'])} shards, {m['totals']['train']['tokens']} train "
                        f"tokens, {m['tokens_per_s']:.0f} tokens/s"
                        + (f" ({m['tokens_per_s'] / bare:.2f} of a bare forward's {bare:.0f})"
                           if bare else ""),
                "norms": norms}


@dataclass
class TrainStageReport(StageReport):
    report: TrainReport
    out: Path
    online: bool  # train.source=online
    feeder: FeederReport | None = None  # online: how the stream was fed (None: unread)

    @classmethod
    def read(cls, out: Path, online: bool, feeder: FeederReport | None) -> TrainStageReport:
        return cls(TrainReport.read(out), out, online, feeder)

    def metrics(self) -> dict[str, float]:
        r = self.report
        out = {"tokens_per_s": r.tokens_per_s, "steps": r.steps,
               **{f"train.acc_step{k}": a for k, a in enumerate(r.train_accuracy)},
               **{f"heldout.acc_step{k}": a for k, a in enumerate(r.heldout_accuracy)},
               **{f"heldout.full_acc_step{k}": a
                  for k, a in enumerate(r.heldout_full_accuracy)}}
        if not self.online:
            return out
        fed = asdict(self.feeder) if self.feeder is not None else {}
        return {**out, **{f"stream.{k}": v for k, v in fed.items() if not isinstance(v, bool)},
                **_norm_metrics(r.stream.norms, "stream.")}

    def artifacts(self) -> list[Artifact]:
        files = [Artifact("file", self.out / "draft" / "config.json", "draft"),
                 Artifact("file", self.out / TRAIN_REPORT_FILE, "train")]
        if not self.online:
            return files
        return files + [Artifact("figure", _norm_figure(self.report.stream.norms,
                                                        "streamed (first epoch)"),
                                 "train/stream_norm_fingerprints.png")]

    def rows(self) -> dict[str, str]:
        r, f = self.report, self.feeder
        stream = {}
        if self.online:
            stream["stream"] = (
                f"online: {f.computed_steps} steps computed by {f.replicas} target "
                f"replica(s), {f.reused_steps} reused, at most {f.most_queued} queued "
                f"(train.online.queue_steps={f.queue_steps})"
                + (f", rewound {f.rewinds}x for a restarted trainer" if f.rewinds else "")
                if f is not None else
                f"online: the stream's report could not be read ({FEEDER_REPORT_FILE})")
        return {**stream, "draft": r.draft_dir,
                "accuracy": f"per TTT step, held-out {two_places(r.heldout_accuracy)}; train "
                            f"(while training, last epoch) {two_places(r.train_accuracy)}",
                "speed": f"{r.steps} steps, {r.tokens_per_s:.0f} tokens/s in {r.precision}"}


@dataclass
class EvaluateStageReport(StageReport):
    report: EvaluateReport
    out: Path

    @classmethod
    def read(cls, out: Path) -> EvaluateStageReport:
        return cls(EvaluateReport.read(out), out)

    def metrics(self) -> dict[str, float]:
        r = self.report
        splits = {"train": r.train, "heldout": r.heldout}
        return {**{f"{split}.{kind}_pos{i}": v for split, acc in splits.items()
                   for kind in ("full", "conditional")
                   for i, v in enumerate(getattr(acc, kind))},
                "predicted_tau": r.heldout.predicted_tau,
                "predicted_tau_train": r.train.predicted_tau,
                "measured_tau": r.measured_tau or 0.0, "doctor_ok": float(r.verdict.ok)}

    def tags(self) -> dict[str, str]:
        doctor = self.report.verdict
        return {"eyas.doctor": ",".join(doctor.findings) or
                ("inconclusive" if doctor.inconclusive else "ok")}

    def artifacts(self) -> list[Artifact]:
        r = self.report
        probe = r.verdict.probe_norms
        return [Artifact("file", self.out / EVALUATE_FILE, "evaluate"),
                Artifact("text", r.explain, "evaluate/doctor.txt"),
                Artifact("figure", self._accuracy_plot, "evaluate/per_position_accuracy.png"),
                *([Artifact("figure", _norm_figure(probe, "probe set: every layer"),
                            "evaluate/norm_fingerprints.png")] if probe else [])]

    def _accuracy_plot(self):
        from workflows.plots import per_position_bars
        return per_position_bars({"train": self.report.train.full,
                                  "held-out": self.report.heldout.full},
                                 "draft accuracy per position (standalone)")

    def rows(self) -> dict[str, str]:
        r, doctor = self.report, self.report.verdict
        return {"accuracy": f"held-out per position {two_places(r.heldout.full)} (train "
                            f"{two_places(r.train.full)}, on {r.train.samples} training "
                            "samples: eval.max_train_samples)",
                "tau": f"predicted {r.heldout.predicted_tau:.2f}, measured "
                       f"{r.measured_tau:.2f} (reference engine, {r.prompts} prompts)",
                "doctor": doctor.status + (f": {doctor.inconclusive}" if doctor.inconclusive
                                           else "")}

    def results(self) -> dict[str, float]:
        return {"predicted_tau": self.report.heldout.predicted_tau,
                "reference_tau": self.report.measured_tau}
