"""SpecForge and NVIDIA modelopt: id k is the OUTPUT of decoder layer k.

SpecForge's HF path reads `hidden_states[k + 1]`; its SGLang path hands ids to SGLang (which
adds 1). The embedding cannot be captured, and id N-1 would be HF's post-norm state, so the
last block is refused. Defaults: [1, N//2 - 1, N - 4].

Worked example, 60 layers: [block_out:2, block_out:29, block_out:56] -> [2, 29, 56];
[embed, ...] -> refused.
"""
from __future__ import annotations

from eyas.layout import eagle3_default_ids
from eyas.layout import EMBED, FINAL_NORM, HiddenStateLayout, LayoutError, Slot


def to_ids(layout: HiddenStateLayout) -> list[int]:
    n = layout.target.num_layers
    for s in layout.draft_inputs:
        if s in (EMBED, FINAL_NORM) or s.block == n - 1:
            raise LayoutError(
                f"layout {layout.names}: SpecForge/modelopt ids name outputs of layers "
                f"0..{n - 2} only; {s.name} ({s.describe(n)}) cannot be expressed")
    return [s.block for s in layout.draft_inputs]


def from_ids(ids, target, verifier: Slot | None = None) -> HiddenStateLayout:
    n = target.num_layers
    if ids is None:
        # the same layers as the EAGLE-3 default, named as outputs: input of k = output of k-1
        ids = [i - 1 for i in eagle3_default_ids(n)]
    for k in ids:
        if not 0 <= k < n - 1:
            raise LayoutError(f"SpecForge id {k} out of range 0..{n - 2} for {n} layers")
    slots = tuple(Slot("block_out", k) for k in ids)
    return HiddenStateLayout(target, slots, verifier or Slot("block_out", n - 1))
