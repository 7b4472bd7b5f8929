"""Write a P-EAGLE draft as the directory vLLM loads with parallel drafting, in eyas's own
format: EAGLE-3's writer (eyas.draft.checkpoint) with P-EAGLE's config and tensors
(eyas.conventions.vllm_checkpoint: `num_hidden_layers`, `mask_token_id`; `layers.{i}.*` for
the later layers and `mask_hidden` [n_slots*H_target]), eyas_family "peagle"."""
from __future__ import annotations

import os
from pathlib import Path

from eyas.conventions import vllm_checkpoint
from eyas.draft import checkpoint
from eyas.draft.peagle.model import PEagleDraft
from eyas.draft.vocab import DraftVocab
from eyas.layout import HiddenStateLayout

FAMILY = "peagle"


def save_draft(draft: PEagleDraft, layout: HiddenStateLayout, vocab: DraftVocab,
               out_dir: str | os.PathLike, extra: dict | None = None, *,
               vllm_version: str | None = None) -> Path:
    if not isinstance(draft, PEagleDraft):
        raise TypeError(f"a {type(draft).__name__} is not a P-EAGLE draft (PEagleDraft)")
    return checkpoint.save_draft(draft, layout, vocab, out_dir, extra,
                                 vllm_version=vllm_version, writes=checkpoint.Writes(
                                     FAMILY, vllm_checkpoint.peagle_draft_config,
                                     vllm_checkpoint.peagle_weight_shapes))
