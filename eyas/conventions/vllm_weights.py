"""Where vLLM 0.32 holds each tensor of a draft's safetensors once loaded, and what it holds
where the file has none: the expectation eyas.serve.loaded holds the drafter's tensors to.

The drafts eyas serves load through `Eagle3LlamaForCausalLM.load_weights` (llama_eagle3.py:
EAGLE-3, EAGLE 3.1, P-EAGLE) or `DFlashQwen3ForCausalLM.load_weights` (qwen3_dflash.py), which
rename alike: `t2d` is skipped, `d2t` becomes `draft_id_to_target_id` (the same offsets),
P-EAGLE's `mask_hidden` a [1, width] buffer, every other name but `lm_head.*` gains `model.`,
`midlayer.` becomes `layers.0.`, and the model's mapper fuses q/k/v into `qkv_proj` and
gate/up into `gate_up_proj` (rows stacked in that order, one tensor-parallel rank).
A draft without `embed_tokens` gets the target's embedding, one without `lm_head` the
target's lm_head (v1/spec_decode/llm_base_proposer.py `_maybe_share_embeddings`,
`_maybe_share_lm_head`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from eyas.conventions.vllm_checkpoint import MASK_HIDDEN

SKIPPED = ("t2d",)  # read by SGLang and eyas, never by vLLM
RENAMED = {"d2t": "draft_id_to_target_id"}
BUFFERS = {MASK_HIDDEN: lambda t: t.reshape(1, -1)}  # P-EAGLE's, held as [1, width]
# the fused projections: the file's name part -> (vLLM's, the shard's place in its rows)
STACKED = {".q_proj.": (".qkv_proj.", 0), ".k_proj.": (".qkv_proj.", 1),
           ".v_proj.": (".qkv_proj.", 2), ".gate_proj.": (".gate_up_proj.", 0),
           ".up_proj.": (".gate_up_proj.", 1)}
EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
# what the drafter holds that no draft file carries: rotary caches, attention scales, DFlash's
# fused key/value buffers (built from the loaded k/v projections)
DERIVED = ("rotary_emb.", "._k_scale", "._v_scale", "._q_scale", "._prob_scale", "fused_kv")
# what it holds but never reads for a draft file: hidden_norm past the first layer (only layer 0
# of llama_eagle3.py's decoder norms the target's states), DFlash's mask_embedding (read only
# from a mask_embedding.pt beside the weights, which eyas never writes)
UNREAD = re.compile(r"^model\.layers\.[1-9][0-9]*\.hidden_norm\.|^model\.mask_embedding$")


def unread(name: str) -> bool:
    """vLLM holds `name` without reading it (DERIVED from others, or UNREAD)."""
    return any(part in name for part in DERIVED) or UNREAD.search(name) is not None


def held_name(name: str) -> tuple[str, int | None] | None:
    """(the name vLLM holds the file's tensor `name` under, its shard in a fused tensor or
    None), or None for a tensor vLLM never reads."""
    if name in SKIPPED:
        return None
    if name in RENAMED:
        return RENAMED[name], None
    if name in BUFFERS:
        return name, None
    held = name if name.startswith("lm_head.") else "model." + name
    held = held.replace("model.midlayer.", "model.layers.0.", 1)
    for part, (fused, shard) in STACKED.items():
        if part in held:
            return held.replace(part, fused, 1), shard
    return held, None


@dataclass(frozen=True)
class Expected:
    tensor: torch.Tensor
    sources: tuple[str, ...]  # the file's tensors it is made of ("target ..." where shared)


def expected_held(tensors: dict[str, torch.Tensor], config: dict,
                  target_embedding: torch.Tensor, target_ids: torch.Tensor | None) -> dict[str, Expected]:
    """What vLLM's drafter should hold, by its names, for a draft whose file holds `tensors`:
    the file's tensors renamed and fused; the target's embedding where the file has none; and
    for a file without lm_head, the head the draft computes with: its embedding's rows for
    its vocabulary (`target_ids`; None: the full vocabulary) when the config ties them, else
    nothing (what vLLM then holds, the target's head, is reported as not the draft's)."""
    groups: dict[str, list[tuple[int, str, torch.Tensor]]] = {}
    for name, tensor in tensors.items():
        held = held_name(name)
        if held is None:
            continue
        where, shard = held
        groups.setdefault(where, []).append((shard or 0, name, tensor))
    out = {}
    for where, parts in groups.items():
        parts.sort(key=lambda p: p[0])
        tensor = (parts[0][2] if len(parts) == 1 else torch.cat([p[2] for p in parts], 0))
        tensor = BUFFERS.get(where, lambda t: t)(tensor)
        out[where] = Expected(tensor, tuple(p[1] for p in parts))
    if EMBEDDING not in out:
        out[EMBEDDING] = Expected(target_embedding, ("target embed_tokens.weight",))
    if LM_HEAD not in out and config.get("tie_word_embeddings"):
        embed = out[EMBEDDING]
        rows = embed.tensor if target_ids is None else embed.tensor[target_ids]
        out[LM_HEAD] = Expected(rows, embed.sources + ("tie_word_embeddings",))
    return out
