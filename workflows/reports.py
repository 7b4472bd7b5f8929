"""The stages' reports: what each stage measured, typed, under the names MLflow knows it by
(metrics, tags, artifacts), with its rows of the end-of-run summary and its part of the parent
run's summary row. workflows/stages.py builds one per stage from what the stage's Ray work
returned and wrote; `log_report` logs any of them to the stage's run. The MLflow names live
here only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

from eyas.config import ServeConfig
from eyas.evaluate.report import REPORT_FILE as EVALUATE_FILE, EvaluateReport
from eyas.layout import TargetIdentity
from eyas.serve.export import launch_command
from eyas.serve.report import REPORT_FILE as SERVE_FILE, ServeBenchmark, ServeReport
from eyas.train.report import FEEDER_REPORT_FILE, TRAIN_REPORT_FILE, FeederReport, TrainReport
from workflows.tracking import Tracking

PARITY_WORDS = {True: "ok", False: "FAILED", None: "not applicable"}
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
            return {"data": f"online: the probe set only ({m['totals']['train']['samples']} "
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
                "speed": f"{r.steps} steps, {r.tokens_per_s:.0f} tokens/s"}


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
                            f"{two_places(r.train.full)})",
                "tau": f"predicted {r.heldout.predicted_tau:.2f}, measured "
                       f"{r.measured_tau:.2f} (reference engine, {r.prompts} prompts)",
                "doctor": doctor.status + (f": {doctor.inconclusive}" if doctor.inconclusive
                                           else "")}

    def results(self) -> dict[str, float]:
        return {"predicted_tau": self.report.heldout.predicted_tau,
                "reference_tau": self.report.measured_tau}


@dataclass
class PromptSetsReport(StageReport):
    """Per prompt set: tau with its interval, per-position acceptance, and at every concurrency
    vLLM bench serve's metrics with and without the draft (sets.NAME.c4.spec.p99_tpot_ms ...);
    a plot of tau per set; the gap alarm's findings. Part of the serve stage's report and of
    what the compare command logs per draft."""

    bench: ServeBenchmark
    gap: dict | None

    def metrics(self) -> dict[str, float]:
        out = {}
        for r in self.bench.prompt_sets:
            low, high = r.acceptance["tau_interval"]
            head = {"tau": r.sweep[0].tau, "tau_low": low, "tau_high": high,
                    **{f"acceptance_pos{i}": a
                       for i, a in enumerate(r.sweep[0].per_position_acceptance)}}
            out.update({f"sets.{r.name}.{k}": v for k, v in head.items()})
            for p in r.sweep:
                at = f"sets.{r.name}.c{p.concurrency}."
                out.update({f"{at}ratio": p.ratio, f"{at}tau": p.tau})
                for side, measured in (("spec.", p.with_draft), ("plain.", p.without_draft)):
                    out.update({f"{at}{side}{k}": v for k, v in (measured or {}).items()})
        return {**out, **({"gap_findings": len(self.gap["findings"])} if self.gap else {})}

    def tags(self) -> dict[str, str]:
        if not self.gap:
            return {}
        return {"eyas.gap": ",".join(f["name"] for f in self.gap["findings"]) or "ok"}

    def artifacts(self) -> list[Artifact]:
        if not self.bench.prompt_sets:
            return []
        return [Artifact("figure", self._tau_per_set, "serve/tau_per_set.png")]

    def _tau_per_set(self):
        from workflows.plots import tau_per_set
        return tau_per_set(self.bench.prompt_sets)

    def rows(self) -> dict[str, str]:
        return {**({"prompt sets": self._sets_line()} if len(self.bench.prompt_sets) > 1
                   else {}),
                **({"gap alarm": self._gap_line()} if self.gap else {})}

    def _sets_line(self) -> str:
        def one(r):
            low, high = r.acceptance["tau_interval"]
            return (f"{r.name} τ {r.sweep[0].tau:.2f} ± {(high - low) / 2:.2f}, ratio "
                    f"{r.sweep[0].ratio:.2f}")
        return "; ".join(one(r) for r in self.bench.prompt_sets)

    def _gap_line(self) -> str:
        gap = self.gap
        if not gap["findings"]:
            return (f"quiet: served acceptance per position within {gap['z']} standard errors "
                    f"of the evaluate stage's on {', '.join(gap['compared'])}")
        return "FIRED: " + "; ".join(f["message"] for f in gap["findings"])


@dataclass
class ComparedDraftReport(StageReport):
    """What the compare command logs of one draft it served."""

    report: ServeReport

    def _sets(self) -> PromptSetsReport:
        return PromptSetsReport(self.report.benchmark, self.report.gap)

    def metrics(self) -> dict[str, float]:
        bench = self.report.benchmark
        return {"tau": bench.tau, "latency_ratio": bench.latency_ratio,
                "lossless": float(bench.lossless), **self._sets().metrics()}

    def tags(self) -> dict[str, str]:
        return self._sets().tags()

    def artifacts(self) -> list[Artifact]:
        return self._sets().artifacts()


@dataclass
class ServeStageReport(StageReport):
    report: ServeReport
    out: Path
    serve: ServeConfig
    target_path: str
    draft: str  # the draft served (serve.draft or the run's)

    @classmethod
    def read(cls, out: Path, serve: ServeConfig, target_path: str,
             draft: str) -> ServeStageReport:
        return cls(ServeReport.read(out), out, serve, target_path, draft)

    def _sets(self) -> PromptSetsReport | None:
        bench = self.report.benchmark
        return PromptSetsReport(bench, self.report.gap) if bench else None

    def metrics(self) -> dict[str, float]:
        r, bench = self.report, self.report.benchmark
        out = {"parity": float(r.parity)} if r.parity is not None else {}
        weights = (r.parity_detail or {}).get("weights")
        if weights is not None:  # eyas.serve.loaded: the drafter holds the draft's tensors
            out.update(loaded_weights=float(weights["ok"]),
                       loaded_logits_error=weights["logits"]["error"])
        if bench is None:
            return out
        out.update({"tau": bench.tau, "tokens_per_s_spec": bench.tokens_per_s_spec,
                    "tokens_per_s_plain": bench.tokens_per_s_plain, "speedup": bench.speedup,
                    "latency_ratio": bench.latency_ratio,
                    "time_per_token_ms_spec": bench.time_per_token_ms_spec,
                    "time_per_token_ms_plain": bench.time_per_token_ms_plain,
                    "lossless": float(bench.lossless)})
        for p in bench.sweep:
            at = f"concurrency{p.concurrency}."
            out.update({f"{at}tau": p.tau, f"{at}ratio": p.ratio,
                        f"{at}tokens_per_s_spec": p.tokens_per_s_spec,
                        f"{at}tokens_per_s_plain": p.tokens_per_s_plain,
                        f"{at}time_per_token_ms_spec": p.time_per_token_ms_spec,
                        f"{at}time_per_token_ms_plain": p.time_per_token_ms_plain,
                        f"{at}lossless": float(p.lossless)})
        out.update({f"acceptance_pos{i}": a for i, a in enumerate(bench.per_position_acceptance)})
        if bench.acceptance.get("tau_interval"):  # 95 %, from the accepted lengths' spread
            out.update(zip(("tau_low", "tau_high"), bench.acceptance["tau_interval"]))
        return {**out, **self._sets().metrics()}

    def tags(self) -> dict[str, str]:
        r, bench = self.report, self.report.benchmark
        return {"eyas.parity": "refused by the doctor" if r.refused else PARITY_WORDS[r.parity],
                "eyas.engine": bench.engine_version if bench else self.serve.engine,
                "eyas.draft": self.draft, **(self._sets().tags() if bench else {})}

    def artifacts(self) -> list[Artifact]:
        r, bench = self.report, self.report.benchmark
        launch = launch_command("vllm", self.target_path, r.served or self.draft,
                                self.serve.num_speculative_tokens)
        out = [Artifact("file", self.out / SERVE_FILE, "serve"),
               Artifact("text", launch, "serve/launch_vllm.txt")]
        if bench is None:
            return out
        if len(bench.sweep) > 1:
            out.append(Artifact("figure", self._sweep_plot, "serve/concurrency_sweep.png"))
        out.append(Artifact("figure", self._acceptance_plot, "serve/per_position_acceptance.png"))
        return out + self._sets().artifacts()

    def _sweep_plot(self):
        from workflows.plots import concurrency_sweep
        return concurrency_sweep([asdict(p) for p in self.report.benchmark.sweep])

    def _acceptance_plot(self):
        from workflows.plots import per_position_bars
        return per_position_bars({self.serve.engine: self.report.benchmark.per_position_acceptance},
                                 "served per-position acceptance")

    def rows(self) -> dict[str, str]:
        r, bench = self.report, self.report.benchmark
        parted = sum(len(p.partings or []) for s in bench.prompt_sets for p in s.sweep)
        sweep = ", ".join(f"c={p.concurrency} {p.ratio:.2f}" for p in bench.sweep[1:])
        low, high = bench.acceptance.get("tau_interval") or (bench.tau, bench.tau)
        return {"tau": f"{bench.tau:.2f} ± {(high - low) / 2:.2f} (95 %, "
                       f"{bench.acceptance.get('drafts', 0)} drafts; {bench.engine_version}, k="
                       f"{bench.num_speculative_tokens}, {bench.prompts} prompts)",
                "latency": f"concurrency 1: {bench.time_per_token_ms_spec:.1f} ms/token with "
                           f"the draft vs {bench.time_per_token_ms_plain:.1f} without, ratio "
                           f"{bench.latency_ratio:.2f}; lossless"
                           + (f" ({parted} outputs parted, each at a near-tie of the "
                              f"target's, {self.serve.dtype} numerics)" if parted else ""),
                **({"sweep": f"speculative / plain time per token: {sweep}"} if sweep else {}),
                **self._sets().rows(),
                "parity": {True: "engine feeds the trained slots", False: "FAILED (forced)",
                           None: r.parity_detail["message"]}[r.parity]}

    def results(self) -> dict[str, float]:
        bench = self.report.benchmark
        # concurrency 1's latency ratio: the headline
        return {f"{self.serve.engine}_tau": bench.tau, "speedup": bench.speedup,
                "latency_ratio": bench.latency_ratio}
