"""Parity: the tensors vLLM will feed the draft must be the slots it was trained on.

They are captured for the probe samples (every layer of which the extraction stored) and each
is matched, tensor by tensor, against every stored layer; the doctor words what is wrong
(eyas.doctor.checks.fed_slots_finding): other slots, shifted ones, or the right slots with
values further from the stored ones than the stored and the engine's dtypes allow. On the
reference engine parity is not applicable: it reads the slots with the extractor's own code.
"""
from __future__ import annotations

from pathlib import Path

import torch

from eyas.conventions.engines import engine_rules
from eyas.store.reader import ExtractedDataset
from eyas.doctor.candidates import slots_in_words
from eyas.doctor.checks import fed_slots_finding
from eyas.doctor.fingerprints import (HandedFeatures, match_features, matched_layout,
                                      parity_tolerance, split_norms)
from eyas.layout import HiddenStateLayout, Slot


class ServeFault(RuntimeError):
    """What stops the serve stage: a draft that fails parity (nothing is benchmarked), or the
    served acceptance's alarm (eyas.serve.run: raised once the benchmark is written)."""


class ParityError(ServeFault):
    """The engine does not feed the draft what it was trained on, or refuses it."""


def _draft_layout(draft_dir: Path, data_layout: HiddenStateLayout | None = None
                  ) -> HiddenStateLayout:
    """The layout the draft was trained on: its own record, or for a draft another trainer
    made (no eyas layout inside), the data's, which it is then assumed to have learned."""
    from eyas.draft.directory import LAYOUT_KEY, read_config
    config = read_config(draft_dir)
    if LAYOUT_KEY not in config and data_layout is not None:
        return data_layout
    return HiddenStateLayout.from_dict(config[LAYOUT_KEY], str(draft_dir))


def engine_options(longest: int, cfg=None):
    """Engine options whose context fits the longest sequence (multiple of 256), computing in
    `cfg.dtype` with `cfg.cpu_threads` threads (cfg: eyas.config.ServeConfig, resolved; None:
    float32 on one thread)."""
    from eyas.engines.vllm_engine import EngineOptions, usable_cores
    context = max(512, -(-longest // 256) * 256)
    if cfg is None:
        return EngineOptions(max_model_len=context)
    return EngineOptions(dtype=cfg.dtype or "float32", max_model_len=context,
                         torch_threads=cfg.cpu_threads or usable_cores())


def vllm_features(target_dir, draft_dir, probe: ExtractedDataset, count: int, options
                  ) -> list[HandedFeatures]:
    """Per probe sample, the tensors vLLM feeds the draft, in fc order (ids as vLLM reads
    them from the draft config)."""
    from eyas.engines.vllm_capture import capture_hidden_states
    from eyas.engines.vllm_checks import check_draft_for_target

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


def check_parity(engine: str, target_dir, draft_dir, data_dir, count: int = 2, cfg=None
                 ) -> dict:
    """Do the tensors the engine feeds the draft equal the stored training slots? Checked on
    the probe samples (every layer stored), token by token, within `parity_tolerance` for the
    stored dtype, the engine's (`cfg`: the ServeConfig, see `engine_options`) and the one the
    extraction ran the target in (its manifest's `target_dtype`; float32 where unrecorded)."""
    if not engine_rules(engine).checks_parity:
        return not_applicable(engine)
    probe = ExtractedDataset(data_dir, "probe")
    trained = _draft_layout(Path(draft_dir), probe.layout)
    stored = split_norms(probe)
    sample = probe[0]
    # what the extraction stored in (FP8 reads back as bfloat16: its rounding is float8's)
    stored_dtype = getattr(torch, probe.manifest.get("dtype") or "", None) or next(
        iter(sample.slots.values())).dtype
    options = engine_options(
        max(len(probe[i].input_ids) for i in range(min(count, len(probe)))) + 1, cfg)
    compute_dtype = getattr(torch, options.dtype)
    extracted = probe.manifest.get("target_dtype")
    extraction_dtype = getattr(torch, extracted) if extracted else None
    # the deepest slot compared sets the walk of rounding errors (fingerprints.parity_tolerance)
    depth = max(s.stream_index() for s in trained.draft_inputs)
    tolerance = parity_tolerance(stored_dtype, compute_dtype, depth, extraction_dtype)
    rows, fed = [], None
    for features in vllm_features(target_dir, draft_dir, probe, count, options):
        matches = match_features(features, trained, probe, stored)
        rows.append([vars(m) | {"norms": [m.norms.mean, m.norms.std]} for m in matches])
        fed = matched_layout(matches, trained)
        if fed is None or fed.draft_inputs != trained.draft_inputs:
            break
    worst = max(m["distance"] for row in rows for m in row)
    numerics = (f"{str(stored_dtype).removeprefix('torch.')} stored, "
                f"{extracted or 'float32'} in the extraction, {options.dtype} in the engine, "
                f"{depth} blocks deep")
    finding = fed_slots_finding(trained, fed, [m["best"] for m in rows[-1]], worst, tolerance,
                                numerics)
    ok = finding is None
    message = (f"parity: {engine} feeds the draft {slots_in_words(trained.draft_inputs)}, as trained "
               f"(worst mean per-token relative error {worst:.1e}, tolerance {tolerance:.1e} for {numerics})"
               if ok else f"parity FAILED ({finding.name}): {finding.message}")
    return {"ok": ok, "engine": engine, "applicable": True, "message": message,
            "matches": rows, "tolerance": tolerance, "worst_error": worst,
            "fed": fed.names if fed else None, "trained": trained.names}
