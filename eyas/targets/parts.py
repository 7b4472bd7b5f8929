"""The parts of the target a draft works with, loaded alone (never the whole model): its token
embedding, and its head (final norm + lm_head) that turns the verifier state into the logits
the draft is trained to match and judged against."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from eyas.conventions.hf import decoder_parts
from eyas.files import read_model_config
from eyas.nn import RMSNorm
from eyas.targets import text_config


class TargetHead(nn.Module):
    """The target's final norm and lm_head: verifier state [B, T, H] -> logits [B, T, V]."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head
        self.requires_grad_(False)

    @classmethod
    def from_model(cls, model) -> "TargetHead":
        return cls(decoder_parts(model)[2], model.get_output_embeddings())

    def forward(self, verifier):
        return self.lm_head(self.norm(verifier))


def _tensor(target_dir: Path, *names: str) -> torch.Tensor | None:
    """The first of `names` found in the target's safetensors files, read alone."""
    index = target_dir / "model.safetensors.index.json"
    where = (json.loads(index.read_text())["weight_map"] if index.exists() else
             {n: "model.safetensors" for n in names})
    for name in names:
        if name in where and (target_dir / where[name]).exists():
            with safe_open(str(target_dir / where[name]), framework="pt") as f:
                if name in f.keys():
                    return f.get_tensor(name)
    return None


def target_parts(target_dir: str | Path) -> tuple[torch.Tensor, TargetHead]:
    """The target's token embedding [V, H] and its final norm + lm_head, nothing else loaded."""
    target_dir = Path(target_dir)
    config = text_config(read_model_config(target_dir, "target"))
    embed = _tensor(target_dir, "model.embed_tokens.weight")
    norm_w = _tensor(target_dir, "model.norm.weight")
    head = _tensor(target_dir, "lm_head.weight")
    if head is None and config.get("tie_word_embeddings"):
        head = embed
    if embed is None or norm_w is None or head is None:
        raise ValueError(f"{target_dir}: could not find model.embed_tokens / model.norm / "
                         "lm_head weights in its safetensors files")
    norm = RMSNorm(norm_w.shape[0], config.get("rms_norm_eps", 1e-6))
    norm.weight.data.copy_(norm_w.float())
    linear = torch.nn.Linear(head.shape[1], head.shape[0], bias=False)
    linear.weight.data.copy_(head.float())
    return embed.float(), TargetHead(norm, linear)
