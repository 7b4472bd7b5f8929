"""Write a draft (EAGLE-3's, and every family's through `Writes`) as the directory vLLM loads
unmodified, in eyas's own format.

    out_dir/config.json        vLLM's draft config (eyas.conventions.vllm_checkpoint.draft_config)
                               plus eyas's keys: `eyas_layout` (the HiddenStateLayout),
                               `eyas_model_args` (the model's constructor arguments) and
                               `eyas_extra` (what training recorded)
    out_dir/model.safetensors  fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d

The layout and the model's arguments travel with the draft (nanoGPT's model_args habit): the
evaluator and the serving actor read the layout from here and compare it with their data's,
never re-derive it from a config, and the model is rebuilt from its arguments
(eyas.draft.eagle3.formats.own reads the format back; eyas.draft.load.load loads any draft).
Each file is written to a temp name and renamed, so a killed writer leaves no half file.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Callable, NamedTuple
from pathlib import Path

import torch

from eyas.draft.spec import DraftModel
from eyas.draft.vocab import DraftVocab
from eyas.conventions import vllm_checkpoint
from eyas.draft.directory import EXTRA_KEY, LAYOUT_KEY, MODEL_ARGS_KEY, stamp, write_draft
from eyas.conventions.kinds import FAMILY_KEY
from eyas.layout import HiddenStateLayout, LayoutError

_NOT_SAVED = ("embed_tokens.weight",)  # the target's, shared by vLLM


def check_tensors(tensors: dict, shapes: dict, dtype, where: str, optional=()) -> None:
    """Refuse tensors whose names, shapes or dtypes are not exactly vLLM's (`shapes`: from
    vllm_checkpoint.draft_weight_shapes; `optional`: names that may be absent)."""
    missing = sorted(set(shapes) - set(tensors) - set(optional))
    unexpected = sorted(set(tensors) - set(shapes))
    if missing or unexpected:
        raise ValueError(f"{where}: tensor names differ from vLLM's draft weights "
                         f"(missing {missing}, unexpected {unexpected})")
    for name, shape in shapes.items():
        got = tensors.get(name)
        if got is None:
            continue
        index_dtype = vllm_checkpoint.DRAFT_INDEX_DTYPES.get(name)
        want_dtype = getattr(torch, index_dtype) if index_dtype else dtype
        if tuple(got.shape) != shape or got.dtype != want_dtype:
            raise ValueError(f"{where}: {name} is {got.dtype} {tuple(got.shape)}, "
                             f"vLLM expects {want_dtype} {shape}")


class Writes(NamedTuple):
    """What a family's draft directory holds for vLLM: its `family` name (eyas_family), its
    config.json (`config`: (model args, layout, dtype, vLLM version) -> dict) and its tensors
    (`weight_shapes`: model args -> name -> shape)."""

    family: str
    config: Callable
    weight_shapes: Callable


EAGLE3_WRITES = Writes("eagle3", vllm_checkpoint.draft_config,
                       vllm_checkpoint.draft_weight_shapes)


def save_draft(draft: DraftModel, layout: HiddenStateLayout, vocab: DraftVocab,
               out_dir: str | os.PathLike, extra: dict | None = None, *,
               vllm_version: str | None = None, writes: Writes = EAGLE3_WRITES) -> Path:
    """Write `draft` for vLLM; refuses a layout, vocab or shape that doesn't fit the draft.
    `writes`: the family's vLLM config and tensors (EAGLE-3's; P-EAGLE's add its layers and
    mask, DFlash's are its own)."""
    family, write_config, weight_shapes = writes
    cfg = draft.config
    layout.expect_draft_inputs(cfg.num_aux_hidden_states, "the draft's fc")
    if layout.target.hidden_size != cfg.target_hidden_size:
        raise LayoutError(f"layout's target hidden size {layout.target.hidden_size} differs from "
                          f"the draft's target_hidden_size {cfg.target_hidden_size}")
    if not vocab.equals(draft.vocab):
        raise ValueError("the vocab passed to save_draft differs from the d2t/t2d the draft was "
                         "built (and trained) with")
    dtype = draft.fc.weight.dtype
    args = asdict(cfg)
    config = write_config(args, layout, str(dtype).removeprefix("torch."), vllm_version)
    config[LAYOUT_KEY] = layout.to_dict()
    config[MODEL_ARGS_KEY] = args
    config[FAMILY_KEY] = family
    stamp(config)
    if extra:
        config[EXTRA_KEY] = extra
    # serialized before any file is written: a non-JSON `extra` fails with nothing on disk
    text = json.dumps(config, indent=2, sort_keys=True)
    shapes = weight_shapes(args)
    # d2t/t2d only where vLLM has parameters for them (a reduced vocabulary)
    skip = {*_NOT_SAVED} | ({"d2t", "t2d"} - set(shapes))
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in draft.state_dict().items()
               if k not in skip}
    check_tensors(tensors, shapes, dtype, f"save_draft ({family})")

    return write_draft(out_dir, vllm_checkpoint.DRAFT_WEIGHTS_FILE, tensors, text)
