"""eyas's own format: a `LlamaForCausalLMEagle3` draft, read as vLLM reads it (formats.eagle3),
whose config.json also carries eyas's keys (eyas.draft.checkpoint writes them):

  eyas_layout      the slots it was trained on, by name: the claim (never inferred from ids)
  eyas_model_args  the model's constructor arguments (Eagle3Config's fields): it is rebuilt
                   from them; a config the doctor's write_fixed wrote for another trainer's
                   draft has none, and is rebuilt from what vLLM reads
  eyas_extra       what training recorded

`check` holds such a draft to its own record before it is used (not when the doctor examines
it): the ids vLLM reads compile from its layout, and the tensors are exactly vLLM's names,
shapes and dtypes (but d2t/t2d, which are served as vLLM serves them: weights.served_vocab).
"""
from __future__ import annotations

import torch

from eyas.draft.directory import LAYOUT_KEY, MODEL_ARGS_KEY
from eyas.conventions.kinds import FAMILY_KEY

from eyas.draft.checkpoint import check_tensors
import eyas.draft.eagle3.formats.eagle3 as eagle3
from eyas.draft.claims import Claims, FormatError, model_args_from
from eyas.conventions import vllm
from eyas.conventions.vllm import AUX_IDS_KEY
from eyas.conventions.vllm_checkpoint import (NORM_OPTIONS, draft_weight_shapes,
                                              read_draft_config, read_norm_options)
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity


def matches(config: dict) -> bool:
    return (LAYOUT_KEY in config and config.get(FAMILY_KEY, "eagle3") in ("eagle3", "eagle3.1")
            and eagle3.matches(config))


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    view = read_draft_config(config)
    return claims(config, model_args_from(config, view, shapes, target, source), view, shapes,
                  target, source)


def claims(config: dict, args: dict, view, shapes: dict, target: TargetIdentity,
           source: str) -> Claims:
    """An eyas draft's claims, given the model arguments read from what vLLM reads (`args`):
    held to its recorded eyas_model_args and norm options, its recorded layout the claim
    (P-EAGLE's reader calls it too, with its own arguments)."""
    stored = config.get(MODEL_ARGS_KEY)
    if stored is not None:
        lost = lost_norm_options(config)
        if lost:
            raise FormatError(f"{source}: {lost}")
        differ = [k for k in args if stored.get(k) != args[k]]
        if differ:
            raise FormatError(f"{source}: {MODEL_ARGS_KEY} and the keys vLLM reads differ on "
                              f"{differ}, so eyas would rebuild another draft than vLLM serves; "
                              "was config.json edited by hand?")
        args = dict(stored)
    recorded = HiddenStateLayout.from_dict(config[LAYOUT_KEY], source=source)
    notes = []
    if recorded.target.num_layers != target.num_layers:
        notes.append(f"the draft was trained for a {recorded.target.num_layers}-block "
                     f"target; this one has {target.num_layers}")
    return Claims("eyas", args, view, recorded, f"{LAYOUT_KEY} {recorded.names}",
                  "d2t" in shapes, notes)


def lost_norm_options(config: dict) -> str:
    """The normalisation options an eyas draft was trained with (eyas_model_args) that its
    config.json, which is what vLLM reads and applies, says otherwise, in words ("" if none)."""
    stored, read = config.get(MODEL_ARGS_KEY) or {}, read_norm_options(config)
    lost = {k: bool(stored[k]) for k in NORM_OPTIONS
            if k in stored and bool(stored[k]) != read[k]}
    if not lost:
        return ""
    return (f"trained with {lost} ({MODEL_ARGS_KEY}) but config.json says "
            f"{ {k: read[k] for k in lost} }, which is what vLLM reads and applies: it would "
            f"serve another function than the one trained; write {lost} at the top level of "
            "config.json")


def check(claims: Claims, tensors: dict[str, torch.Tensor], where: str,
          weight_shapes=draft_weight_shapes) -> None:
    """Refuse an eyas draft that contradicts its own record. `tensors`: under the names the
    files hold; `weight_shapes`: the family's (vllm_checkpoint's)."""
    top, nested = claims.view.top_ids, claims.view.nested_ids
    if top is not None and nested is not None and top != nested:
        raise LayoutError(f"{where}: {AUX_IDS_KEY} {top} (read by vLLM) differs from "
                          f"eagle_config's {nested} (read by SGLang)")
    ids = claims.view.ids
    if ids is None:
        raise LayoutError(f"{where}: no {AUX_IDS_KEY}; vLLM would use its default ids, which "
                          "eyas refuses to guess")
    layout = claims.layout
    if vllm.to_ids(layout) != ids:
        raise LayoutError(f"{where}: config.json's vLLM ids {ids} do not compile from its own "
                          f"layout {layout.names} (which gives {vllm.to_ids(layout)}); was the "
                          "config edited by hand?")
    dtype = tensors["fc.weight"].dtype if "fc.weight" in tensors else torch.float32
    check_tensors(tensors, weight_shapes(claims.model_args), dtype, where,
                  optional=("d2t", "t2d"))
