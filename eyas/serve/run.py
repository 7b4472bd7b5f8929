"""The serve stage: prove parity (eyas/serve/parity.py: the engine feeds the trained slots;
eyas/serve/loaded.py: it holds the draft's tensors and computes its logits), then benchmark speculative decoding
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
from eyas.conventions.engines import engine_rules
from eyas.extract.on_demand import open_split
from eyas.serve.parity import ParityError, ServeFault, check_parity
from eyas.doctor.profile import profile_file
from eyas.serve.report import ServeBenchmark, ServeReport


class DraftRefused(ParityError):
    """The doctor's checks found a fault in the draft to be served."""


def preflight(target_dir, draft_dir, data_dir, engine: str, steps: int = 3,
              weigh: bool = True, served_length: int | None = None) -> dict:
    """The doctor's static checks (eyas.doctor.checks.static_findings), its weights' evidence
    (eyas.doctor.diagnose.weights_finding: another layout fits the draft better beyond doubt)
    and, for vLLM, its engine check (what vLLM feeds from the draft's config against the slots
    it was trained on) on the draft to be served, before any engine boots. `weigh=False`:
    the evidence was already weighed on this draft (the evaluate stage of this run, which
    would have stopped on its finding). `served_length`: the longest sequence the benchmark
    will serve (a draft's rotary range must reach it). Returns the findings and what was
    read."""
    from eyas.draft.load import load
    from eyas.doctor.checks import static_findings
    from eyas.doctor.diagnose import Diagnosis, weights_finding
    from eyas.doctor.engine import claims_feed, engine_check
    from eyas.doctor.findings import Finding
    from eyas.doctor.load import prepared_chat_template
    from eyas.draft.claims import FormatError
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    target = identify(target_dir)
    embedding, head = target_parts(target_dir)
    config_traps = _config_traps(draft_dir, target_dir, engine, served_length)
    try:
        loaded = load(draft_dir, embedding, target, examine=True)
    except FormatError as e:  # a tensor missing, unexpected or of the wrong shape
        return {"format": None, "says": None, "loaded": None, "engine": None,
                "findings": config_traps + [Finding("weights_format", str(e))]}
    claims, data_layout = loaded.claims, open_split(data_dir, "heldout", states=False).layout
    out = {"format": claims.format, "says": claims.says, "loaded": loaded, "engine": None}
    if claims.layout is None:
        out["findings"] = [Finding("layout_unknown", (
            f"the draft's config does not say which target tensors it was trained on "
            f"({claims.says}); run eyas doctor data={data_dir} draft={draft_dir} "
            "engine=vllm write_fixed=DIR, then serve.draft=DIR"))]
        return out
    findings = static_findings(claims.layout, data_layout, loaded.draft.vocab, target,
                               prepared_chat_template(data_dir), loaded.d2t_missing)
    fit = weights_finding(Diagnosis(loaded.draft, claims.layout, data_dir, target_head=head,
                                    target=target, steps=steps)) if weigh else None
    findings += [fit] if fit is not None else []
    if engine_rules(engine).runners:  # it reads the ids from the draft's config
        check = engine_check(claims, claims_feed(claims, target, engine),
                             f"what the config says ({claims.says})", recorded=claims.layout)
        out["engine"] = {k: v for k, v in check.to_dict().items() if k != "lines"}
        findings += [check.finding] if check.finding else []
    named = {f.name for f in findings}
    out["findings"] = findings + [f for f in config_traps if f.name not in named]
    return out


def _config_traps(draft_dir, target_dir, engine: str, served_length: int | None) -> list:
    """The config-only doctor's findings (eyas.doctor.static.examine: an empty id list, ids
    fc is not sized for or past the target's layers, a DFlash attention mode other than
    trained, a mask the engine cannot read) for the runner this machine's vLLM uses; a rotary
    range shorter than `served_length`; and tensors of the weights written all zero."""
    from eyas.doctor.static import examine, positions_finding, zeroed_tensors
    from eyas.draft.directory import read_config

    device = "cuda" if _has_cuda() else "cpu"
    verdict = examine(draft_dir, target_dir, engine=engine, device=device)
    out = list(verdict.findings) + zeroed_tensors(draft_dir)
    if served_length is not None and not any(f.name == "short_positions" for f in out):
        out += positions_finding(read_config(draft_dir), verdict.reading.draft, served_length,
                                 verdict.reading.kind, "the longest sequence this benchmark serves")
    return out


def served_length(data_dir, cfg: ServeConfig) -> int:
    """The longest sequence the benchmark serves from the held-out split: its longest
    conversation (a bound on its prompts) and max_new_tokens and k past it."""
    heldout = open_split(data_dir, "heldout", states=False)
    longest = max((len(heldout[i].input_ids) for i in range(len(heldout))), default=0)
    return longest + cfg.max_new_tokens + cfg.num_speculative_tokens + 1


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _served_copy(draft_dir, checked: dict, out: Path) -> str:
    """The directory the engine boots with: the draft itself, or for another format a copy
    whose config vLLM reads as the original (ids in both places). The copy does not record
    the layout as eyas's: parity then holds the fed tensors to the data's slots, as for any
    draft another trainer made (eyas.serve.parity)."""
    from eyas.draft import fixed

    claims = checked["loaded"].claims
    if claims.format == "eyas":
        return str(draft_dir)
    return str(fixed.write_fixed(draft_dir, out / "draft", claims, claims.layout, "vllm",
                                 record_layout=False))


def admit(target_dir, draft_dir, data_dir, cfg: ServeConfig, out: Path,
          weighed: bool = False) -> ServeReport:
    """The doctor's checks, then parity: the report a benchmark goes on from, or DraftRefused
    / ParityError (with the report written to `out`) unless serve.force. `weighed`: this run's
    evaluate stage already weighed the draft's weights (preflight's `weigh`)."""
    out.mkdir(parents=True, exist_ok=True)
    checked = preflight(target_dir, draft_dir, data_dir, cfg.engine, cfg.num_speculative_tokens,
                        weigh=not weighed, served_length=served_length(data_dir, cfg))
    findings = checked["findings"]
    doctor = {"format": checked["format"], "says": checked["says"],
              "engine": checked["engine"], "findings": [vars(f) for f in findings]}
    # a draft whose layout is unknown, or whose weights eyas cannot read, is never forced
    forceable = checked["loaded"] is not None and checked["loaded"].claims.layout is not None
    if findings and (not cfg.force or not forceable):
        ServeReport(cfg.engine, str(draft_dir), None, doctor, False).write(out)
        raise DraftRefused(
            "the doctor's checks refuse this draft before benchmarking: "
            + "; ".join(f"{f.name}: {f.message}" for f in findings)
            + (" (serve.force=true benchmarks anyway)" if forceable else ""))
    rules = engine_rules(cfg.engine)
    served = _served_copy(draft_dir, checked, out) if rules.serves_checked_copy else str(draft_dir)
    parity = check_parity(cfg.engine, target_dir, served, data_dir, cfg=cfg)
    if rules.checks_loaded_weights and (parity["ok"] or cfg.force):
        from eyas.serve.loaded import check_loaded
        parity["weights"] = check_loaded(target_dir, served, data_dir, cfg)
        parity["ok"] = parity["ok"] and parity["weights"]["ok"]
        parity["message"] += "; " + parity["weights"]["message"]
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
    report.diagnosis = [vars(f) for f in contributes_nothing(report)]
    report.write(out)
    gaps = report.gap["findings"] if report.gap else []
    if (gaps or report.diagnosis) and not cfg.force:  # the position that fell short first
        raise (ServedGap if gaps else ServedNothing)(
            "; ".join(f["message"] for f in gaps + report.diagnosis)
            + " (serve.force=true records it without failing the stage)")
    return report.to_dict()


# a draft whose first position is accepted less often than this, or whose tau is below
# NOTHING_TAU, contributes nothing: an untrained draft of SmolLM2 is accepted at position 1
# at 0.1-1 % (a random one of 8192 tokens, 1/8192), the run's draft at about 60 %
NOTHING_FIRST, NOTHING_TAU = 0.02, 1.02


def contributes_nothing(report: ServeReport) -> list:
    """"contributes_nothing" when the served draft's first position is (almost) never
    accepted or tau is (almost) 1 on the held-out prompts at concurrency 1: whatever the
    gap to an offline profile, the draft is not doing its job, and the usual causes are
    named."""
    from eyas.doctor.findings import Finding

    bench = report.benchmark
    if bench is None or bench.tau is None or not bench.per_position_acceptance:
        return []
    first = bench.per_position_acceptance[0]
    if first >= NOTHING_FIRST and bench.tau >= NOTHING_TAU:
        return []
    weights = (report.parity_detail or {}).get("weights")
    loaded = ("its loaded weights were proven equal to the file's" if weights and weights["ok"]
              else "its loaded weights were not proven (weights_* findings)" if weights
              else "its loaded weights were not checked (serve with vLLM)")
    return [Finding("contributes_nothing", (
        f"the served draft contributes nothing: tau {bench.tau:.3f}, its first token "
        f"accepted in {first:.1%} of drafts over {bench.prompts} held-out prompts (below "
        f"{NOTHING_FIRST:.0%} or tau below {NOTHING_TAU}); check the weights the engine "
        f"loaded ({loaded}), the vocabulary map (an all-zero or foreign d2t maps every draft "
        f"to the wrong tokens) and the feed (parity: which target layers reach it), then "
        f"whether it was trained at all (its train report's accuracy)"))]


class ServedNothing(ServeFault):
    """The served draft's first position is almost never accepted, or tau is almost 1."""


class ServedGap(ServeFault):
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
