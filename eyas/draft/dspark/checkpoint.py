"""Write a DSpark draft as the directory vLLM's V2 runner loads unmodified (`method: "dspark"`),
in eyas's own format:

    out_dir/config.json        vLLM's DSpark config (eyas.conventions.vllm_dspark.draft_config:
                               Qwen3DSparkModel, DFlash's keys and dflash_config {mask_token_id,
                               target_layer_ids, causal}, markov_rank, block_size,
                               sample_from_anchor, the confidence head's flags) plus eyas's
                               keys: eyas_layout, eyas_model_args (DSparkConfig's fields),
                               eyas_family "dspark", eyas_extra
    out_dir/model.safetensors  DFlash's tensors (fc, hidden_norm, layers.*, norm, lm_head; d2t,
                               t2d with a reduced vocabulary) + markov_head.markov_w1/w2,
                               confidence_head.proj weight and bias; no embed_tokens

Read back by eyas.draft.dspark.formats. Each file is written to a temp name and renamed.
"""
from __future__ import annotations

import os
from pathlib import Path

from eyas.conventions import vllm_dspark
from eyas.draft import checkpoint as shared
from eyas.draft.dspark.model import DSparkDraft
from eyas.draft.vocab import DraftVocab
from eyas.layout import HiddenStateLayout

FAMILY = "dspark"


def save_draft(draft: DSparkDraft, layout: HiddenStateLayout, vocab: DraftVocab,
               out_dir: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write `draft` for vLLM; refuses a layout DSpark cannot be fed (the embedding), or a
    layout, vocab or shape that doesn't fit the draft."""
    return shared.save_draft(
        draft, layout, vocab, out_dir, extra, writes=shared.Writes(
            FAMILY, lambda args, layout, dtype, version: vllm_dspark.draft_config(
                args, layout, dtype), vllm_dspark.weight_shapes))
