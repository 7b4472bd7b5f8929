"""Which stored slot is a handed-in feature? Norm fingerprints, or a direct comparison.

Every slot of the probe split (every layer's output) has a norm fingerprint: mean and std over
tokens of the per-token L2 norm. They grow along the residual stream (on one real target:
embedding 1.04, block outputs 37 to 174), so the norms of features an engine feeds a draft say which
layers they were read from. When the features come with their token ids and those are a
probe sample's, the tensors themselves are compared: exact, even between adjacent blocks whose
norms are close.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from eyas.layout import HiddenStateLayout, LayoutError, Slot, SlotNorms


@dataclass(frozen=True)
class HandedFeatures:
    """Features something (e.g. an engine) fed the draft, one [T, H] tensor per fc slot."""

    slots: list[torch.Tensor]  # in the draft's fc order
    token_ids: torch.Tensor | None = None  # [T], when known

    @classmethod
    def from_concat(cls, features, n_slots: int, token_ids=None) -> "HandedFeatures":
        """From [T, n*H] tensors (a list of them is joined along T), or {position: [T, H]}."""
        if isinstance(features, dict):
            return cls([features[i] for i in sorted(features)], token_ids)
        joined = torch.cat(list(features)) if isinstance(features, (list, tuple)) else features
        if joined.dim() == 3:  # vLLM's extract_hidden_states: [T, n_ids, H]
            return cls(list(joined.unbind(1)), token_ids)
        if joined.shape[-1] % n_slots:
            raise LayoutError(f"features of width {joined.shape[-1]} do not split into "
                              f"{n_slots} slots")
        return cls(list(joined.chunk(n_slots, dim=-1)), token_ids)


@dataclass(frozen=True)
class SlotMatch:
    position: int  # in the draft's fc
    expected: str  # the slot the draft was trained on there
    norms: SlotNorms  # of the handed-in feature
    best: str  # the stored slot it matches best
    by: str  # "tensors" (compared on a probe sample) or "norms"
    distance: float  # mean per-token relative error (tensors) or |log mean ratio| (norms)


def norms_of(x: torch.Tensor) -> SlotNorms:
    n = x.float().norm(dim=-1).reshape(-1)
    return SlotNorms(float(n.mean()), float(n.std()) if n.numel() > 1 else 0.0)


def split_norms(dataset) -> dict[str, SlotNorms]:
    """Norm fingerprint of every slot a split stores (the probe split: every layer)."""
    names = list(dataset[0].slots)
    return {name: norms_of(torch.cat([dataset[i].slots[name] for i in range(len(dataset))]))
            for name in names}


def _by_norms(x: torch.Tensor, stored: dict[str, SlotNorms]) -> tuple[str, float]:
    mine = norms_of(x)
    # scale-free: norms span 100x along the stream, so compare log means (std breaks ties)
    def gap(s: SlotNorms) -> float:
        return abs(math.log(max(mine.mean, 1e-12) / max(s.mean, 1e-12)))
    best = min(stored, key=lambda name: (gap(stored[name]), abs(mine.std - stored[name].std)))
    return best, gap(stored[best])


def _probe_sample(probe, token_ids: torch.Tensor):
    """The probe sample whose tokens start with `token_ids` (an engine may add output)."""
    for i in range(len(probe)):
        s = probe[i]
        t = min(len(s.input_ids), len(token_ids))
        if t and torch.equal(s.input_ids[:t], token_ids[:t].to(s.input_ids.dtype)):
            return s, t
    return None, 0


def token_relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean over tokens of |x_t - ref_t| / |ref_t| (x, ref: [T, H]).

    Per token, not over the whole tensor: on a pretrained target a few tokens carry massive
    activations (SmolLM2-135M: norm ~25,000 at every middle block against a median of ~170)
    and barely change from block to block, so a whole-tensor error between two neighbouring
    blocks is ~1e-2 there, within bf16 rounding; per token they differ by 0.2-0.4.
    """
    x, ref = x.float(), ref.float()
    return float(((x - ref).norm(dim=-1) / ref.norm(dim=-1).clamp(min=1e-12)).mean())


def match_features(features: HandedFeatures, layout: HiddenStateLayout, probe,
                   stored: dict[str, SlotNorms]) -> list[SlotMatch]:
    """For each handed-in slot: which stored slot it is, by tensors when possible."""
    layout.expect_draft_inputs(len(features.slots), "the handed-in features")
    sample, t = (_probe_sample(probe, features.token_ids) if features.token_ids is not None
                 else (None, 0))
    out = []
    for i, (x, expected) in enumerate(zip(features.slots, layout.draft_inputs)):
        if sample is not None:
            ref = {name: v[:t].float() for name, v in sample.slots.items()}
            err = {name: token_relative_error(x[:t], v) for name, v in ref.items()}
            best = min(err, key=err.get)
            out.append(SlotMatch(i, expected.name, norms_of(x), best, "tensors", err[best]))
        else:
            best, gap = _by_norms(x, stored)
            out.append(SlotMatch(i, expected.name, norms_of(x), best, "norms", gap))
    return out


def matched_layout(matches: list[SlotMatch], layout: HiddenStateLayout
                   ) -> HiddenStateLayout | None:
    """The layout the handed-in features really are (verifier: the recorded one); None when
    two features match one stored slot (no layout says that)."""
    n = layout.target.num_layers
    slots = tuple(Slot.parse(m.best, n) for m in matches)
    if len(set(slots)) != len(slots):
        return None
    return HiddenStateLayout(layout.target, slots, layout.verifier)


# Two float32 implementations of one target (vLLM's kernels, HF's) agree to ~1e-5..1e-4
# relative per token; 1e-3 leaves room, and is still far below the distance between two blocks.
FLOAT32_AGREEMENT = 1e-3
# Measured bf16 rounding is a random walk; a fed tensor is allowed this many times its spread.
TOLERANCE_MARGIN = 3.0


def parity_tolerance(stored: torch.dtype, compute: torch.dtype, depth: int = 1,
                     extracted: torch.dtype | None = None) -> float:
    """Mean per-token relative error allowed between a fed tensor and the stored one
    (`token_relative_error`).

    Storing rounds each element to `stored`: at most half its machine epsilon (bfloat16:
    3.9e-3). Each side that computes in a 16-bit dtype (the engine: `compute`; the
    extraction: `extracted`, default float32) rounds the residual stream once per block, and
    those errors add up as a random walk: sqrt(depth) x eps/2 after `depth` blocks, the two
    sides independently. Measured on SmolLM2-135M (30 blocks), HF and vLLM both in bfloat16:
    0.0044 after 1 block, 0.013 after 14, 0.021 after 27, against sqrt(depth) x 3.9e-3 =
    0.0039, 0.015, 0.020; neighbouring blocks there differ by 0.22-0.42. Allowed:
    TOLERANCE_MARGIN x (FLOAT32_AGREEMENT + stored rounding + both sides' walks). E.g.
    float32 everywhere: 3.0e-3; bfloat16 stored and in both, 27 blocks deep: 0.10.
    """
    def walk(dtype: torch.dtype | None) -> float:
        if dtype is None or torch.finfo(dtype).bits >= 32:
            return 0.0
        return math.sqrt(max(1, depth)) * torch.finfo(dtype).eps / 2
    rounding = torch.finfo(stored).eps / 2 if torch.finfo(stored).bits < 32 else 0.0
    walks = math.hypot(walk(compute), walk(extracted))
    return TOLERANCE_MARGIN * (FLOAT32_AGREEMENT + rounding + walks)
