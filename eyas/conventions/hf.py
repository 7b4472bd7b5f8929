"""Hugging Face transformers: `output_hidden_states` indices, and capture by hooks.

HF `hidden_states[i]` is the input of decoder layer i (i = 0: the embedding output), and
`hidden_states[N]` is the last layer's output AFTER the final norm. So the pre-norm output of
the last block (the usual verifier state) has no HF index: `capture()` takes it with a hook.

Worked example, N = 4: [embed, block_out:1, block_out:2] -> [0, 2, 3];
final_norm -> 4; block_out:3 (final_prenorm) -> no index (refused).
"""
from __future__ import annotations

import torch

from eyas.layout import EMBED, FINAL_NORM, LayoutError, Slot, TargetIdentity


def to_indices(slots, target: TargetIdentity) -> list[int]:
    n = target.num_layers
    out = []
    for slot in slots:
        if slot == FINAL_NORM:
            out.append(n)
        elif slot.stream_index() == n:
            raise LayoutError(
                f"slot {slot.name} (last block output before the final norm) has no HF "
                f"output_hidden_states index: index {n} is after the final norm. "
                "eyas.conventions.hf.capture takes it with a hook")
        else:
            out.append(slot.stream_index())
    return out


def from_indices(indices, target: TargetIdentity) -> tuple[Slot, ...]:
    n = target.num_layers
    for i in indices:
        if not 0 <= i <= n:
            raise LayoutError(f"HF hidden_states index {i} out of range 0..{n} ({n} layers)")
    return tuple(FINAL_NORM if i == n else Slot.at_stream_index(i, n) for i in indices)


def decoder_parts(model):
    """(embedding, decoder layers, final norm) of an HF causal LM (Llama/Qwen/DeepSeek style)."""
    base = getattr(model, "model", model)
    try:
        return base.embed_tokens, base.layers, base.norm
    except AttributeError as e:
        raise LayoutError(
            f"{type(model).__name__}: expected .model.embed_tokens/.layers/.norm as in HF "
            "decoder-only causal LMs") from e


@torch.no_grad()
def capture(model, input_ids: torch.Tensor | None, slots, attention_mask=None,
            inputs_embeds: torch.Tensor | None = None, first_block: int = 0,
            keep_last: bool = False, past_key_values=None) -> dict[Slot, torch.Tensor]:
    """Run the target (or a slice of its blocks) once; return each slot's tensor [B, T, H].

    Hooks read the residual stream where it is: the embedding's output, each block's output
    (pre-norm, what vLLM captures as hidden_states + residual) and the final norm's output.
    The LM head is skipped: no slot needs logits. For a slice holding blocks
    [first_block, first_block + len(layers)), pass the previous slice's output as
    `inputs_embeds`; with `keep_last` the slice's last block output is returned too, under
    the key "handoff", to hand on to the next slice. With `past_key_values` (an HF Cache
    holding the positions before `input_ids`) only the new positions are computed, the cache
    extended with them.
    """
    embed, layers, norm = decoder_parts(model)
    wanted = set(slots)
    got: dict = {}

    def keep(key):
        def hook(_module, _inputs, output):
            got[key] = output[0] if isinstance(output, tuple) else output
        return hook

    handles = []
    if EMBED in wanted and inputs_embeds is None:
        handles.append(embed.register_forward_hook(keep(EMBED)))
    for i, layer in enumerate(layers):
        slot = Slot("block_out", first_block + i)
        if slot in wanted:
            handles.append(layer.register_forward_hook(keep(slot)))
    if keep_last:
        handles.append(layers[-1].register_forward_hook(keep("handoff")))
    if FINAL_NORM in wanted:
        handles.append(norm.register_forward_hook(keep(FINAL_NORM)))
    try:
        getattr(model, "model", model)(input_ids=input_ids if inputs_embeds is None else None,
                                       inputs_embeds=inputs_embeds,
                                       attention_mask=attention_mask,
                                       use_cache=past_key_values is not None,
                                       past_key_values=past_key_values)
    finally:
        for h in handles:
            h.remove()
    return got
