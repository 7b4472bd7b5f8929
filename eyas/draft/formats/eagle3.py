"""vLLM's / SGLang's `LlamaForCausalLMEagle3` draft (EAGLE's and eyas's own checkpoints).

Read in vLLM 0.32 (model_executor/models/llama_eagle3.py, config/speculative.py,
v1/worker/gpu_model_runner.py `_get_eagle3_aux_layers_from_config`):
- ids: top-level `eagle_aux_hidden_state_layer_ids` first, else `eagle_config`'s, else the
  default (2, N//2, N-3); id k = the input of layer k (vLLM's convention);
- fc is sized from `num_aux_hidden_states`, else len(eagle_config's list), else 3;
- the norm options as `vllm_checkpoint.read_norm_options` reads them (absent means off).
eyas's drafts add `eyas_layout` (the slots by name) and write the ids in both places. A config
with ids ONLY under eagle_config is read by `formats.specforge` (SGLang's convention).
"""
from __future__ import annotations

from eyas.draft.formats.common import (
    AUX_IDS_KEY,
    Claims,
    VllmView,
    claimed_from_vllm_ids,
    hyper_from,
    ids_or_none,
)
from eyas.engines import vllm
from eyas.engines.vllm_checkpoint import DRAFT_ARCHITECTURES, read_norm_options
from eyas.layout import HiddenStateLayout, TargetIdentity

LAYOUT_KEY = "eyas_layout"  # eyas.draft.checkpoint.LAYOUT_KEY


def matches(config: dict) -> bool:
    return bool(set(config.get("architectures") or []) & set(DRAFT_ARCHITECTURES))


def view(config: dict) -> VllmView:
    eagle = config.get("eagle_config") or {}
    num_aux = config.get("num_aux_hidden_states")
    return VllmView(ids_or_none(config.get(AUX_IDS_KEY)), ids_or_none(eagle.get(AUX_IDS_KEY)),
                    None if num_aux is None else int(num_aux),
                    eagle.get("use_aux_hidden_state", True) is not False)


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    hyper = hyper_from(config, shapes, target, source, read_norm_options(config))
    v, notes = view(config), []
    if LAYOUT_KEY in config:
        recorded = HiddenStateLayout.from_dict(config[LAYOUT_KEY], source=source)
        if recorded.target.num_layers != target.num_layers:
            notes.append(f"the draft was trained for a {recorded.target.num_layers}-block "
                         f"target; this one has {target.num_layers}")
        return Claims("eyas", hyper, v, recorded, f"{LAYOUT_KEY} {recorded.names}",
                      "d2t" in shapes, notes)
    return claims_from_ids("eagle3", hyper, v, shapes, target, source, notes)


def claims_from_ids(name: str, hyper: dict, v: VllmView, shapes: dict, target: TargetIdentity,
                    source: str, notes: list[str]) -> Claims:
    """The claim of a config whose ids are read as vLLM reads them (top-level first)."""
    ids = v.top_ids or v.nested_ids
    where = "top-level" if v.top_ids else "under eagle_config" if ids else ""
    if v.top_ids and v.nested_ids and v.top_ids != v.nested_ids:
        notes.append(f"the top-level ids {v.top_ids} (read by vLLM) differ from eagle_config's "
                     f"{v.nested_ids} (read by SGLang); the claim is read from the top level")
    layout = claimed_from_vllm_ids(ids, hyper["num_aux_hidden_states"], target, source, notes)
    says = (f"{AUX_IDS_KEY} {ids} {where} (vLLM's convention: id k = input of layer k)"
            if ids else f"no {AUX_IDS_KEY}: which slots it was trained on is unknown")
    return Claims(name, hyper, v, layout, says, "d2t" in shapes, notes)


def vllm_ids(layout: HiddenStateLayout, version: str | None = None) -> list[int]:
    return vllm.to_ids(layout, version)
