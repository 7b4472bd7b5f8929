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

import os
from pathlib import Path

from eyas.conventions import vllm_dflash
from eyas.draft.dflash.model import DFlashDraft
from eyas.draft import checkpoint as shared
from eyas.draft.vocab import DraftVocab
from eyas.layout import HiddenStateLayout

FAMILY = "dflash"


def save_draft(draft: DFlashDraft, layout: HiddenStateLayout, vocab: DraftVocab,
               out_dir: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write `draft` for vLLM; refuses a layout DFlash cannot be fed (the embedding), or a
    layout, vocab or shape that doesn't fit the draft. EAGLE-3's writer, with DFlash's
    config and tensors (eyas.conventions.vllm_dflash)."""
    return shared.save_draft(
        draft, layout, vocab, out_dir, extra, writes=shared.Writes(
            FAMILY, lambda args, layout, dtype, version: vllm_dflash.draft_config(
                args, layout, dtype), vllm_dflash.weight_shapes))
