"""vLLM's / SGLang's `LlamaForCausalLMEagle3` draft (EAGLE's checkpoints, and any config of that
architecture without eyas's keys).

Read as vLLM 0.32 reads it (eyas.conventions.vllm_checkpoint.read_draft_config: the ids top-level
first, else eagle_config's; fc sized from num_aux_hidden_states, else len(eagle_config's list),
else 3; the norm options, absent meaning off); id k = the input of layer k (vLLM's convention).
eyas's own drafts (with `eyas_layout`) are read by `formats.own`; a config with ids ONLY under
eagle_config by `formats.specforge` (SGLang's convention).
"""
from __future__ import annotations

from eyas.draft.claims import (Claims, claimed_from_vllm_ids, layout_from_stream,
                                             model_args_from)
from eyas.conventions.vllm import AUX_IDS_KEY
from eyas.conventions.vllm_checkpoint import DRAFT_ARCHITECTURES, VllmView, read_draft_config
from eyas.layout import TargetIdentity


def matches(config: dict) -> bool:
    """vLLM's draft class names, or EAGLE's own training template (eagle/traineagle3/
    config.json): a one-layer `LlamaForCausalLM` with a draft vocabulary, which vLLM renames
    to Eagle3LlamaForCausalLM under method eagle3 (transformers_utils/configs/eagle.py 55-76)."""
    archs = set(config.get("architectures") or [])
    template = (archs == {"LlamaForCausalLM"} and config.get("num_hidden_layers") == 1
                and "draft_vocab_size" in config)
    return bool(archs & set(DRAFT_ARCHITECTURES)) or template


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    view = read_draft_config(config)
    args = model_args_from(config, view, shapes, target, source)
    return claims_from_ids("eagle3", args, view, shapes, target, source, [])


def claims_from_ids(name: str, args: dict, view: VllmView, shapes: dict,
                    target: TargetIdentity, source: str, notes: list[str]) -> Claims:
    """The claim of a config whose ids are read as vLLM reads them (top-level first). Ids only
    under eagle_config are read one way whatever the draft's architecture: as SGLang's
    convention (id k = output of layer k), the one the tools that write only that key use
    (SpecForge, TorchSpec; formats.specforge reads the Llama drafts among them)."""
    if view.top_ids is None and view.nested_ids:
        ids = view.nested_ids
        notes.append(f"ids only under eagle_config ({ids}): read as SGLang's convention (output "
                     "of layer k), as SpecForge and TorchSpec write them; vLLM's V1 runner reads "
                     "them as inputs of layers, its V2 runner not at all")
        layout = (layout_from_stream([k + 1 for k in ids], target, source,
                                     "SGLang's ids (output of layer k)")
                  if len(set(ids)) == args["num_aux_hidden_states"] else None)
        return Claims(name, args, view, layout,
                      f"eagle_config.{AUX_IDS_KEY} {ids} (SGLang's convention: id k = output "
                      "of layer k)", "d2t" in shapes, notes)
    ids = view.ids
    where = "top-level" if view.top_ids else "under eagle_config" if ids else ""
    if view.top_ids and view.nested_ids and view.top_ids != view.nested_ids:
        notes.append(f"the top-level ids {view.top_ids} (read by vLLM) differ from "
                     f"eagle_config's {view.nested_ids} (read by SGLang); the claim is read from "
                     "the top level")
    layout = claimed_from_vllm_ids(ids, args["num_aux_hidden_states"], target, source, notes)
    says = (f"{AUX_IDS_KEY} {ids} {where} (vLLM's convention: id k = input of layer k)"
            if ids else f"no {AUX_IDS_KEY}: which slots it was trained on is unknown")
    return Claims(name, args, view, layout, says, "d2t" in shapes, notes)
