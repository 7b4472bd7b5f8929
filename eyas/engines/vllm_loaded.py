"""The tensors vLLM's drafter holds once booted, read back in-process
(eyas.engines.vllm_draft_logits.drafter), by vLLM's names.

A linear layer's weight is read through the layer itself: the identity through its own
matmul (`quant_method.apply`) gives back W^T, whatever the backend did with the weight after
loading (vLLM's CPU backend repacks bf16 weights for its kernels and leaves `weight` empty; a
quantised GPU layer gives its dequantised values). Every other parameter is read as held.
"""
from __future__ import annotations

import torch

from eyas.conventions.vllm_weights import BUFFERS
from eyas.engines.vllm_draft_logits import drafter

CHUNK = 1024  # identity rows per matmul: memory stays chunk x width


def _through_layer(module, chunk: int = CHUNK) -> torch.Tensor:
    """W [out, in] of a vLLM linear layer, from its own forward on the identity."""
    width = (getattr(module, "input_size_per_partition", None)
             or getattr(module, "input_size", None) or module.embedding_dim)  # an lm head
    weight = module.weight
    dtype = getattr(module, "params_dtype", None) or weight.dtype
    rows = []
    with torch.no_grad():
        for start in range(0, width, chunk):
            eye = torch.zeros(min(chunk, width - start), width, dtype=dtype,
                              device=weight.device)
            eye[:, start:start + eye.shape[0]].fill_diagonal_(1)
            rows.append(module.quant_method.apply(module, eye, None).float().cpu())
    return torch.cat(rows, 0).T.contiguous()


def _computes_through(owner, name: str) -> bool:
    """A weight the layer multiplies by (linear layers, lm heads), as opposed to one it looks
    up (the embedding) or scales by (norms): read through the layer, which on CPU computes
    with its repacked copy, not with `weight`."""
    return (name.endswith(".weight") and hasattr(owner, "quant_method")
            and type(owner).__name__ != "VocabParallelEmbedding")


def held_tensors(engine) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """({vLLM name: tensor on CPU, in the dtype held (a linear's: float32 of its output)},
    {vLLM name: how it was read}) for the drafter of an in-process VllmEngine."""
    model = drafter(engine).model
    modules = dict(model.named_modules())
    out, how = {}, {}
    for name, param in model.named_parameters():
        owner = modules.get(name.rpartition(".")[0])
        if _computes_through(owner, name):
            out[name], how[name] = _through_layer(owner), "through its layer"
        else:
            out[name], how[name] = param.detach().cpu(), "as held"
    for name, buffer in model.named_buffers():
        if name.rpartition(".")[2] in BUFFERS:  # those a draft file fills (P-EAGLE's)
            out[name], how[name] = buffer.detach().cpu(), "as held"
    return out, how
