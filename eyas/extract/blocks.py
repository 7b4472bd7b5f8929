"""The HF extraction backend: a target, or a contiguous slice of its blocks, on one device.

A replica of the target may span several devices: its blocks are divided into contiguous
slices (`split_blocks`), one `TargetBlocks` per device, and each stage hands its last block's
output to the next as `inputs_embeds`. Every stage captures the layout's slots that live in
its blocks; the union over stages is what the unsplit target gives.

Each stage loads the checkpoint with `from_pretrained` and keeps only its blocks. That bounds
GPU memory per stage, not host memory while loading: for targets larger than a node's RAM, use
the vLLM backend (tensor/pipeline parallel).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.conventions import hf
from eyas.layout import EMBED, FINAL_NORM, LayoutError, Slot

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float8_e4m3fn": torch.float8_e4m3fn}  # stored states only (extract.dtype)


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def split_blocks(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) block ranges, as even as possible: (5, 2) -> [(0, 3), (3, 5)]."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} blocks into {num_stages} stages")
    bounds = [round(i * num_layers / num_stages) for i in range(num_stages + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T] 1 = real token
    lengths: list[int]


def make_batch(samples: list[list[int]], pad_id: int) -> Batch:
    longest = max(len(s) for s in samples)
    ids = torch.full((len(samples), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), longest), dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
    return Batch(ids, mask, [len(s) for s in samples])


class TargetBlocks:
    """Blocks [start, end) of the target at `target_dir`, capturing the slots that live there."""

    def __init__(self, target_dir: str, start: int = 0, end: int | None = None,
                 device: str = "cpu", dtype: str = "float32"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch_dtype(dtype))
        embed, layers, _norm = hf.decoder_parts(model)
        self.num_layers = len(layers)
        self.start, self.end = start, self.num_layers if end is None else end
        if not 0 <= self.start < self.end <= self.num_layers:
            raise LayoutError(f"stage blocks [{start}, {end}) outside the target's "
                              f"{self.num_layers} blocks")
        base = getattr(model, "model", model)
        base.layers = torch.nn.ModuleList(list(layers)[self.start:self.end])
        if hasattr(model, "lm_head"):
            model.lm_head = None  # no slot needs logits; frees vocab x hidden
        self.model = model.to(device).eval()
        self.device = device
        self.first, self.last = self.start == 0, self.end == self.num_layers

    def _owns(self, slot: Slot) -> bool:
        if slot == EMBED:
            return self.first
        if slot == FINAL_NORM:
            return self.last
        return self.start <= slot.block < self.end

    @torch.no_grad()
    def forward(self, batch: Batch, hidden: torch.Tensor | None, slots):
        """-> (handoff [B, T, H] for the next stage or None, {slot: [B, T, H]} on CPU)."""
        mask = batch.attention_mask.to(self.device)
        mine = [s for s in slots if self._owns(s)]
        got = hf.capture(self.model, batch.input_ids.to(self.device) if self.first else None,
                         mine, attention_mask=mask,
                         inputs_embeds=None if self.first else hidden.to(self.device),
                         first_block=self.start, keep_last=not self.last)
        handoff = got.pop("handoff", None)
        missing = set(mine) - set(got)
        if missing:
            raise LayoutError(f"stage [{self.start}, {self.end}) did not capture "
                              f"{sorted(s.name for s in missing)}")
        return handoff, {s: t.detach().to("cpu") for s, t in got.items()}


def run_blocks(stages, batch: Batch, slots) -> dict[Slot, torch.Tensor]:
    """Push a batch through consecutive stages in this process (tests, single-host runs)."""
    hidden, captured = None, {}
    for stage in stages:
        hidden, got = stage.forward(batch, hidden, slots)
        captured.update(got)
    return captured
