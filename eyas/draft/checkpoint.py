"""Save and load a draft as the directory vLLM loads unmodified, with the layout inside.

    out_dir/config.json        vLLM's draft config (eyas.engines.vllm_checkpoint.draft_config) plus
                               `eyas_layout` (the HiddenStateLayout) and `eyas_extra`
    out_dir/model.safetensors  fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d

The layout travels with the draft (nanoGPT's model_args habit): the evaluator and the serving
actor read it from here and compare it with their data's, never re-derive it from a config.
Each file is written to a temp name and renamed, so a killed writer leaves no half file.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eyas.draft.model import Eagle3Config, Eagle3Draft
from eyas.draft.vocab import DraftVocab
from eyas.engines import vllm, vllm_checkpoint
from eyas.files import atomic_path, atomic_write, read_model_config
from eyas.layout import HiddenStateLayout, LayoutError

CONFIG_FILE = "config.json"
LAYOUT_KEY = "eyas_layout"
EXTRA_KEY = "eyas_extra"
_NOT_SAVED = ("embed_tokens.weight",)  # the target's, shared by vLLM


def _check_tensors(tensors: dict, shapes: dict, dtype, where: str) -> None:
    missing, unexpected = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
    if missing or unexpected:
        raise ValueError(f"{where}: tensor names differ from vLLM's draft weights "
                         f"(missing {missing}, unexpected {unexpected})")
    for name, shape in shapes.items():
        got = tensors[name]
        index_dtype = vllm_checkpoint.DRAFT_INDEX_DTYPES.get(name)
        want_dtype = getattr(torch, index_dtype) if index_dtype else dtype
        if tuple(got.shape) != shape or got.dtype != want_dtype:
            raise ValueError(f"{where}: {name} is {got.dtype} {tuple(got.shape)}, "
                             f"vLLM expects {want_dtype} {shape}")


def save_draft(draft: Eagle3Draft, layout: HiddenStateLayout, vocab: DraftVocab,
               out_dir: str | os.PathLike, extra: dict | None = None, *,
               vllm_version: str | None = None) -> Path:
    """Write `draft` for vLLM; refuses a layout, vocab or shape that doesn't fit the draft."""
    cfg = draft.config
    layout.expect_draft_inputs(cfg.num_aux_hidden_states, "the draft's fc")
    if layout.target.hidden_size != cfg.target_hidden_size:
        raise LayoutError(f"layout's target hidden size {layout.target.hidden_size} differs from "
                          f"the draft's target_hidden_size {cfg.target_hidden_size}")
    if not vocab.equals(draft.vocab):
        raise ValueError("the vocab passed to save_draft differs from the d2t/t2d the draft was "
                         "built (and trained) with")
    dtype = draft.fc.weight.dtype
    hyper = asdict(cfg)
    config = vllm_checkpoint.draft_config(hyper, layout, str(dtype).removeprefix("torch."), vllm_version)
    config[LAYOUT_KEY] = layout.to_dict()
    if extra:
        config[EXTRA_KEY] = extra
    # serialized before any file is written: a non-JSON `extra` fails with nothing on disk
    text = json.dumps(config, indent=2, sort_keys=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in draft.state_dict().items()
               if k not in _NOT_SAVED}
    _check_tensors(tensors, vllm_checkpoint.draft_weight_shapes(hyper), dtype, "save_draft")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / vllm_checkpoint.DRAFT_WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    atomic_write(out / CONFIG_FILE, text + "\n")
    return out


def read_config(path: str | os.PathLike) -> dict:
    return read_model_config(path, "draft")


def load_draft(path: str | os.PathLike, target_embedding: torch.Tensor | torch.nn.Embedding,
               expected_layout: HiddenStateLayout | None = None
               ) -> tuple[Eagle3Draft, HiddenStateLayout, DraftVocab]:
    """Rebuild a saved draft around the target's embedding [vocab, hidden].

    With `expected_layout` (e.g. the evaluation data's), a draft trained on other slots or
    another target is refused with an error naming both sides.
    """
    config = read_config(path)
    where = f"draft {path}"
    hyper, ids = vllm_checkpoint.read_draft_config(config, where)
    if LAYOUT_KEY not in config:
        raise LayoutError(f"{where}: config.json has no {LAYOUT_KEY!r}, so which target tensors "
                          f"its fc expects is unknown (vLLM ids {ids} alone are ambiguous); "
                          "refusing to guess")
    layout = HiddenStateLayout.from_dict(config[LAYOUT_KEY], source=where)
    if vllm.to_ids(layout) != ids:
        raise LayoutError(f"{where}: config.json's vLLM ids {ids} do not compile from its own "
                          f"layout {layout.names} (which gives {vllm.to_ids(layout)}); was the "
                          "config edited by hand?")
    if expected_layout is not None:
        expected_layout.check_matches(layout, "the caller", where)

    tensors = load_file(str(Path(path) / vllm_checkpoint.DRAFT_WEIGHTS_FILE))
    dtype = tensors["fc.weight"].dtype if "fc.weight" in tensors else torch.float32
    _check_tensors(tensors, vllm_checkpoint.draft_weight_shapes(hyper), dtype, where)
    vocab = DraftVocab(tensors["d2t"], tensors["t2d"])
    draft = Eagle3Draft(Eagle3Config(**hyper), target_embedding, vocab).to(dtype)
    missing, unexpected = draft.load_state_dict(tensors, strict=False)
    if set(missing) != set(_NOT_SAVED) or unexpected:
        raise ValueError(f"{where}: state dict mismatch (missing {missing}, unexpected "
                         f"{unexpected})")
    return draft, layout, vocab
