"""What a served benchmark logs (eyas.serve.report.ServeReport, written by eyas.serve.run): the
serve stage's report, what `eyas compare` logs of each draft it served, and the per-prompt-set
part both share; logged by workflows.reports.log_report like every stage's report."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from eyas.config import ServeConfig
from eyas.serve.export import launch_command
from eyas.serve.report import REPORT_FILE as SERVE_FILE, ServeBenchmark, ServeReport
from workflows.reports import Artifact, StageReport

PARITY_WORDS = {True: "ok", False: "FAILED", None: "not applicable"}


def ratio_text(point) -> str:
    """A concurrency-1 ratio with its 95 % interval and how it was measured, e.g. "0.84
    (0.80-0.88, interleaved)"."""
    if point.ratio_interval is None:
        return f"{point.ratio:.2f}"
    low, high = point.ratio_interval
    return (f"{point.ratio:.2f} ({low:.2f}-{high:.2f}"
            + (", interleaved)" if point.interleaved else ", one engine after the other)"))


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
                    f"{ratio_text(r.sweep[0])}")
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
        if bench is None:  # refused before the benchmark: the doctor's findings, or parity's
            return self._refusal_rows()
        parted = sum(len(p.partings or []) for s in bench.prompt_sets for p in s.sweep)
        sweep = ", ".join(f"c={p.concurrency} {p.ratio:.2f}" for p in bench.sweep[1:])
        low, high = bench.acceptance.get("tau_interval") or (bench.tau, bench.tau)
        return {"tau": f"{bench.tau:.2f} ± {(high - low) / 2:.2f} (95 %, "
                       f"{bench.acceptance.get('drafts', 0)} drafts; {bench.engine_version}, k="
                       f"{bench.num_speculative_tokens}, {bench.prompts} prompts)",
                "latency": f"concurrency 1: {bench.time_per_token_ms_spec:.1f} ms/token with "
                           f"the draft vs {bench.time_per_token_ms_plain:.1f} without, ratio "
                           f"{ratio_text(bench.sweep[0])}; lossless"
                           + (f" ({parted} outputs parted, each at a near-tie of the "
                              f"target's, {self.serve.dtype} numerics)" if parted else ""),
                **({"sweep": f"speculative / plain time per token: {sweep}"} if sweep else {}),
                **self._sets().rows(),
                "parity": {True: "engine feeds the trained slots", False: "FAILED (forced)",
                           None: r.parity_detail["message"]}[r.parity]}

    def _refusal_rows(self) -> dict[str, str]:
        r = self.report
        findings = r.doctor.get("findings") or []
        if r.refused:
            return {"refused": "; ".join(f"{f['name']}: {f['message']}" for f in findings)}
        return {"parity": "FAILED: " + (r.parity_detail or {}).get("message", "not checked")}

    def results(self) -> dict[str, float]:
        bench = self.report.benchmark
        # concurrency 1's latency ratio: the headline
        return {f"{self.serve.engine}_tau": bench.tau, "speedup": bench.speedup,
                "latency_ratio": bench.latency_ratio}
