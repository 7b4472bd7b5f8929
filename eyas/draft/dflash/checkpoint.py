"""Write a DFlash draft as the directory vLLM loads unmodified (`method: "dflash"`), in eyas's
own format:

    out_dir/config.json        vLLM's DFlash config (eyas.conventions.vllm_dflash.draft_config:
                               DFlashDraftModel, dflash_config {mask_token_id,
                               target_layer_ids}) plus eyas's keys: eyas_layout, eyas_model_args
                               (DFlashConfig's fields, block_size among them), eyas_family
                               "dflash", eyas_extra
    out_dir/model.safetensors  fc, hidden_norm, layers.*, norm, lm_head (+ d2t, t2d with a
                               reduced vocabulary); no embed_tokens: vLLM shares the target's

Read back by eyas.draft.dflash.formats. Each file is written to a temp name and renamed.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path


from eyas.conventions import vllm_dflash
from eyas.draft.dflash.model import DFlashDraft
from eyas.draft.directory import EXTRA_KEY, LAYOUT_KEY, MODEL_ARGS_KEY, write_draft
from eyas.draft.eagle3.checkpoint import check_tensors
from eyas.draft.families import FAMILY_KEY
from eyas.draft.vocab import DraftVocab
from eyas.layout import HiddenStateLayout, LayoutError

FAMILY = "dflash"


def save_draft(draft: DFlashDraft, layout: HiddenStateLayout, vocab: DraftVocab,
               out_dir: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write `draft` for vLLM; refuses a layout DFlash cannot be fed (the embedding), or a
    layout, vocab or shape that doesn't fit the draft."""
    cfg = draft.config
    if layout.target.hidden_size != cfg.target_hidden_size:
        raise LayoutError(f"layout's target hidden size {layout.target.hidden_size} differs from "
                          f"the draft's target_hidden_size {cfg.target_hidden_size}")
    if not vocab.equals(draft.vocab):
        raise ValueError("the vocab passed to save_draft differs from the d2t/t2d the draft was "
                         "built (and trained) with")
    dtype = draft.fc.weight.dtype
    args = asdict(cfg)
    config = vllm_dflash.draft_config(args, layout, str(dtype).removeprefix("torch."))
    config[LAYOUT_KEY] = layout.to_dict()
    config[MODEL_ARGS_KEY] = args
    config[FAMILY_KEY] = FAMILY
    if extra:
        config[EXTRA_KEY] = extra
    text = json.dumps(config, indent=2, sort_keys=True)  # a non-JSON `extra` fails first
    shapes = vllm_dflash.weight_shapes(args)
    # not the target's embedding; d2t/t2d only with a reduced vocabulary (vLLM's rule)
    skip = {"embed_tokens.weight"} | ({"d2t", "t2d"} - set(shapes))
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in draft.state_dict().items()
               if k not in skip}
    check_tensors(tensors, shapes, dtype, "save_draft (dflash)")

    return write_draft(out_dir, vllm_dflash.WEIGHTS_FILE, tensors, text)
