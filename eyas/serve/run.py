"""The serve stage: prove parity (eyas/serve/parity.py), then benchmark speculative decoding
against the target alone (eyas/serve/bench.py): the held-out prompts and each of
`serve.prompt_sets` with and without the draft, at concurrency 1 (the headline: time per
output token and its ratio) and at each level of `serve.concurrency` (eyas/serve/latency.py),
with acceptance, vLLM bench serve's latency metrics and losslessness (greedy outputs must be
identical) at every level. A failed parity stops the stage with the doctor's words, unless
`serve.force`, which records the failure. Then the gap alarm: each set's served speculation
profile against the evaluate stage's offline one, position by position (`gap_alarm`).

Before any engine boots, the doctor's static checks, its weights' evidence and its engine
check run on the draft (`preflight`): a draft of any format eyas.draft.eagle3.formats reads
(serve.draft=DIR), refused with the doctor's findings (an all-zero d2t, weights that fit other
slots than its config records, a config the engine would feed other slots from, a draft for
another target) unless `serve.force`. The doctor and the serve stage call
the same checks, so they give one answer. A draft of another format is served through a
copy of it with the equivalent eyas config (same weights), which vLLM feeds the same slots.
"""
from __future__ import annotations

from pathlib import Path

from eyas.config import ServeConfig
from eyas.extract.on_demand import open_split
from eyas.serve.parity import ParityError, check_parity
from eyas.doctor.profile import profile_file
from eyas.serve.report import ServeBenchmark, ServeReport


class DraftRefused(ParityError):
    """The doctor's checks found a fault in the draft to be served."""


def preflight(target_dir, draft_dir, data_dir, engine: str, steps: int = 3,
              weigh: bool = True) -> dict:
    """The doctor's static checks (eyas.doctor.checks.static_findings), its weights' evidence
    (eyas.doctor.diagnose.weights_finding: another layout fits the draft better beyond doubt)
    and, for vLLM, its engine check (what vLLM feeds from the draft's config against the slots
    it was trained on) on the draft to be served, before any engine boots. `weigh=False`:
    the evidence was already weighed on this draft (the evaluate stage of this run, which
    would have stopped on its finding). Returns the findings and what was read."""
    from eyas.draft.eagle3.formats.feed import feed
    from eyas.draft.load import load
    from eyas.doctor.checks import static_findings
    from eyas.doctor.diagnose import Diagnosis, weights_finding
    from eyas.doctor.engine import engine_check
    from eyas.doctor.findings import Finding
    from eyas.doctor.load import prepared_chat_template
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    target = identify(target_dir)
    embedding, head = target_parts(target_dir)
    loaded = load(draft_dir, embedding, target, examine=True)
    claims, data_layout = loaded.claims, open_split(data_dir, "heldout", states=False).layout
    out = {"format": claims.format, "says": claims.says, "loaded": loaded, "engine": None}
    if claims.layout is None:
        out["findings"] = [Finding("layout_unknown", (
            f"the draft's config does not say which target tensors it was trained on "
            f"({claims.says}); run python -m workflows.doctor --data {data_dir} --draft "
            f"{draft_dir} --engine vllm --write-fixed DIR, then serve.draft=DIR"))]
        return out
    findings = static_findings(claims.layout, data_layout, loaded.draft.vocab, target,
                               prepared_chat_template(data_dir), loaded.d2t_missing)
    fit = weights_finding(Diagnosis(loaded.draft, claims.layout, data_dir, target_head=head,
                                    target=target, steps=steps)) if weigh else None
    findings += [fit] if fit is not None else []
    if engine == "vllm":
        check = engine_check(claims, feed(claims, target, "vllm"),
                             f"what the config says ({claims.says})", "vllm",
                             recorded=claims.layout)
        out["engine"] = {k: v for k, v in check.to_dict().items() if k != "lines"}
        findings += [check.finding] if check.finding else []
    out["findings"] = findings
    return out


def _served_copy(draft_dir, checked: dict, out: Path) -> str:
    """The directory the engine boots with: the draft itself, or for another format a copy
    whose config vLLM reads as the original (ids in both places). The copy does not record
    the layout as eyas's: parity then holds the fed tensors to the data's slots, as for any
    draft another trainer made (eyas.serve.parity)."""
    from eyas.draft.eagle3 import formats

    claims = checked["loaded"].claims
    if claims.format == "eyas":
        return str(draft_dir)
    return str(formats.write_fixed(draft_dir, out / "draft", claims, claims.layout, "vllm",
                                   record_layout=False))


def admit(target_dir, draft_dir, data_dir, cfg: ServeConfig, out: Path,
          weighed: bool = False) -> ServeReport:
    """The doctor's checks, then parity: the report a benchmark goes on from, or DraftRefused
    / ParityError (with the report written to `out`) unless serve.force. `weighed`: this run's
    evaluate stage already weighed the draft's weights (preflight's `weigh`)."""
    out.mkdir(parents=True, exist_ok=True)
    checked = preflight(target_dir, draft_dir, data_dir, cfg.engine, cfg.num_speculative_tokens,
                        weigh=not weighed)
    findings = checked["findings"]
    doctor = {"format": checked["format"], "says": checked["says"],
              "engine": checked["engine"], "findings": [vars(f) for f in findings]}
    if findings and (not cfg.force or checked["loaded"].claims.layout is None):
        ServeReport(cfg.engine, str(draft_dir), None, doctor, False).write(out)
        raise DraftRefused(
            "the doctor's checks refuse this draft before benchmarking: "
            + "; ".join(f"{f.name}: {f.message}" for f in findings)
            + (" (serve.force=true benchmarks anyway)"
               if checked["loaded"].claims.layout is not None else ""))
    served = _served_copy(draft_dir, checked, out) if cfg.engine == "vllm" else str(draft_dir)
    parity = check_parity(cfg.engine, target_dir, served, data_dir, cfg=cfg)
    failed = parity["ok"] is False or bool(findings)  # None: not applicable to this engine
    report = ServeReport(cfg.engine, str(draft_dir), parity["ok"], doctor, cfg.force and failed,
                         served, parity)
    if failed and not cfg.force:
        report.write(out)
        raise ParityError(parity["message"] + " (serve.force=true benchmarks anyway)")
    return report


def attach(report: ServeReport, bench, results, cfg: ServeConfig) -> ServeReport:
    """The benchmark's results for this draft (eyas.serve.bench) into its report: the
    held-out split at concurrency 1 is the headline."""
    head = results[0]
    one = head.sweep[0]
    report.benchmark = ServeBenchmark(
        engine_version=bench.engine_version, prompts=one.requests,
        num_speculative_tokens=cfg.num_speculative_tokens, max_new_tokens=cfg.max_new_tokens,
        tau=one.tau, per_position_acceptance=one.per_position_acceptance,
        acceptance=head.acceptance,
        time_per_token_ms_spec=one.time_per_token_ms_spec,
        time_per_token_ms_plain=one.time_per_token_ms_plain,
        latency_ratio=one.ratio, speedup=1 / one.ratio,
        tokens_per_s_spec=one.tokens_per_s_spec, tokens_per_s_plain=one.tokens_per_s_plain,
        lossless=all(p.lossless for r in results for p in r.sweep), sweep=head.sweep,
        boot_s=bench.boot_s or None, prompt_sets=results)
    return report


def serve_run(target_dir, draft_dir, data_dir, cfg: ServeConfig, out_dir,
              offline_dir=None) -> dict:
    """Parity, then the benchmark on every prompt set; writes out_dir/report.json
    (eyas.serve.report.ServeReport, also when parity fails) and the served speculation profile
    of each set, and returns the report as written. `offline_dir`: the evaluate stage's
    directory when the draft served is the one it measured: the gap alarm compares their
    profiles, and raises ServedGap (after writing) when a position falls short."""
    from eyas.serve.bench import benchmark

    out = Path(out_dir)
    # the evaluate stage that wrote offline_dir weighed this draft's weights in this run
    report = admit(target_dir, draft_dir, data_dir, cfg, out, weighed=offline_dir is not None)
    bench = benchmark(target_dir, {"draft": report.served}, data_dir, cfg, {"draft": out})
    attach(report, bench, bench.results["draft"], cfg)
    report.gap = gap_alarm(offline_dir, out, [r.name for r in bench.results["draft"]],
                           cfg.gap_z)
    report.write(out)
    if report.gap and report.gap["findings"] and not cfg.force:
        raise ServedGap("; ".join(f["message"] for f in report.gap["findings"])
                        + " (serve.force=true records it without failing the stage)")
    return report.to_dict()


class ServedGap(ParityError):
    """A position of the served profile falls short of the offline one beyond its noise."""


def gap_alarm(offline_dir, out: Path, set_names: list[str], z: float) -> dict | None:
    """The served profiles against the evaluate stage's offline ones, per position and per
    prompt set (eyas.doctor.profile.profile_gap); None when there is no offline profile."""
    from eyas.doctor.profile import profile_gaps, read_profile

    if offline_dir is None:
        return None
    offline = {n: read_profile(Path(offline_dir) / profile_file(n)) for n in set_names
               if (Path(offline_dir) / profile_file(n)).exists()}
    if not offline:
        return None
    served = {n: read_profile(out / profile_file(n)) for n in offline}
    return {"z": z, "compared": sorted(offline),
            "findings": [vars(f) for f in profile_gaps(offline, served, z)]}
