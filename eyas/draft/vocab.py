"""The draft vocabulary: the few target tokens the draft's `lm_head` can propose.

An EAGLE-3 draft's `lm_head` covers `draft_vocab_size` target tokens (e.g. 32k of 128k), chosen
as the most frequent tokens the draft will be asked to predict: the loss-masked (assistant)
tokens of the training data. Two tensors map between the vocabularies, in the form vLLM and
SGLang load from the draft checkpoint:

  d2t  int64 [draft_vocab]   an OFFSET: target id = draft id + d2t[draft id]
  t2d  bool  [target_vocab]  True where the target token is in the draft vocabulary

Worked example, target vocab 8, draft vocab 3, chosen target ids [1, 4, 5]:
  d2t = [1-0, 4-1, 5-2] = [1, 3, 3];  t2d = [F, T, F, F, T, T, F, F]
Draft ids are the chosen target ids in ascending order, so draft order = target order.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

import torch

log = logging.getLogger(__name__)


class VocabError(ValueError):
    """A draft vocabulary that breaks an invariant, or that cannot be built as asked."""


@dataclass(frozen=True, eq=False)
class DraftVocab:
    d2t: torch.Tensor  # int64 [draft_vocab], offsets
    t2d: torch.Tensor  # bool [target_vocab]
    filled: int = 0  # how many ids were never seen in the data (padded by id order)

    def __post_init__(self):
        check_vocab(self.d2t, self.t2d)

    @property
    def size(self) -> int:
        return int(self.d2t.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.t2d.numel())

    @property
    def target_ids(self) -> torch.Tensor:
        """The target id of each draft id, int64 [draft_vocab], ascending."""
        return torch.arange(self.size, dtype=torch.int64, device=self.d2t.device) + self.d2t

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t.to(draft_ids.device)[draft_ids]

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Draft id of each target id; -1 where the target token has no draft id."""
        lookup = torch.full((self.target_vocab_size,), -1, dtype=torch.int64,
                            device=target_ids.device)
        lookup[self.target_ids.to(target_ids.device)] = torch.arange(
            self.size, dtype=torch.int64, device=target_ids.device)
        return lookup[target_ids]

    def equals(self, other: "DraftVocab") -> bool:
        return (torch.equal(self.d2t.cpu(), other.d2t.cpu())
                and torch.equal(self.t2d.cpu(), other.t2d.cpu()))


def check_vocab(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Raise VocabError unless d2t/t2d are a consistent offset map and membership mask."""
    if d2t.dtype != torch.int64 or d2t.dim() != 1:
        raise VocabError(f"d2t must be a 1-D int64 tensor of offsets, got {d2t.dtype} "
                         f"{tuple(d2t.shape)}")
    if t2d.dtype != torch.bool or t2d.dim() != 1:
        raise VocabError(f"t2d must be a 1-D bool tensor over the target vocab, got {t2d.dtype} "
                         f"{tuple(t2d.shape)}")
    n_draft, n_target = d2t.numel(), t2d.numel()
    if n_draft == 0 or n_draft > n_target:
        raise VocabError(f"draft vocab size {n_draft} must be in 1..{n_target} (target vocab)")
    if int(t2d.sum()) != n_draft:
        raise VocabError(f"t2d marks {int(t2d.sum())} target tokens but d2t has {n_draft} draft "
                         "ids: t2d.sum() must equal the draft vocab size")
    target_ids = torch.arange(n_draft, dtype=torch.int64, device=d2t.device) + d2t
    bad = (target_ids < 0) | (target_ids >= n_target)
    if bad.any():
        first = int(bad.nonzero()[0])
        raise VocabError(f"draft id {first} maps to target id {int(target_ids[first])}, outside "
                         f"0..{n_target - 1}: d2t must hold offsets (target id = draft id + "
                         "d2t[draft id]), not target ids")
    if n_draft > 1 and not bool((target_ids[1:] > target_ids[:-1]).all()):
        first = int((target_ids[1:] <= target_ids[:-1]).nonzero()[0])
        raise VocabError(f"d2t + arange must be strictly ascending, but draft ids {first} and "
                         f"{first + 1} map to target ids {int(target_ids[first])} and "
                         f"{int(target_ids[first + 1])}")
    if not bool(t2d.to(target_ids.device)[target_ids].all()):
        raise VocabError("t2d is False for some target id that d2t maps to: the two tensors "
                         "describe different vocabularies")


def count_tokens(samples: Iterable[tuple], target_vocab_size: int) -> torch.Tensor:
    """Occurrences of each target id among loss-masked tokens, int64 [target_vocab].

    `samples` yields (token_ids, loss_mask) pairs (sequences or 1-D tensors); a token counts
    where its mask is 1. Call `.add_()` on the result to merge counts of several shards.
    """
    counts = torch.zeros(target_vocab_size, dtype=torch.int64)
    for ids, mask in samples:
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        mask = torch.as_tensor(mask).reshape(-1).bool()
        if ids.shape != mask.shape:
            raise VocabError(f"token ids {tuple(ids.shape)} and loss mask {tuple(mask.shape)} "
                             "differ in length")
        chosen = ids[mask]
        if chosen.numel() and (int(chosen.min()) < 0 or int(chosen.max()) >= target_vocab_size):
            raise VocabError(f"token id {int(chosen.max())} outside the target vocab "
                             f"0..{target_vocab_size - 1}: data and target disagree")
        counts += torch.bincount(chosen, minlength=target_vocab_size)
    return counts


def build_vocab(counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """The `draft_vocab_size` most frequent ids of `counts` (ties: lower id first).

    Deterministic: the order is (count descending, id ascending). When the data holds fewer
    distinct tokens than `draft_vocab_size`, the rest are the lowest unseen ids (a warning says
    how many), so the head keeps the shape the config asked for.
    """
    counts = torch.as_tensor(counts, dtype=torch.int64).reshape(-1)
    n_target = counts.numel()
    if not 1 <= draft_vocab_size <= n_target:
        raise VocabError(f"draft_vocab_size {draft_vocab_size} must be in 1..{n_target} "
                         "(the target's vocab size)")
    # A stable sort of ids by descending count keeps ties in ascending id order.
    order = torch.sort(-counts, stable=True).indices
    chosen = order[:draft_vocab_size]
    seen = int((counts > 0).sum())
    filled = max(0, draft_vocab_size - seen)
    if filled:
        log.warning("the data has %d distinct loss-masked tokens, fewer than draft_vocab_size=%d;"
                    " the other %d draft ids are the lowest unseen target ids (by id order)",
                    seen, draft_vocab_size, filled)
    target_ids = torch.sort(chosen).values
    d2t = target_ids - torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(n_target, dtype=torch.bool)
    t2d[target_ids] = True
    return DraftVocab(d2t, t2d, filled)


def full_vocab(target_vocab_size: int) -> DraftVocab:
    """The identity map: a draft head over the whole target vocabulary."""
    return DraftVocab(torch.zeros(target_vocab_size, dtype=torch.int64),
                      torch.ones(target_vocab_size, dtype=torch.bool))


def choose_mask_token(target_config, embedding: torch.Tensor, vocab: DraftVocab) -> int:
    """The target id whose (frozen, shared) embedding a parallel draft's mask positions read
    (P-EAGLE's later positions, a DFlash block's masks; recorded in the draft's config).

    vLLM embeds the masks with the target's own table (no new token can be added to it), so
    the id must be the target's. Preferred: its pad token, which chat data never holds as an
    answer token, so a real bonus token rarely looks like a mask. Else the highest id outside
    the draft vocabulary (the draft never proposes it, and the vocabulary holds the data's
    most frequent answer tokens; a BPE vocabulary's last ids are its rarest merges or its
    reserved tokens). Rows that are all zero are skipped (HF zeroes the padding row, some
    models leave reserved rows untrained): a zero embedding gives every mask the same zero
    query in the first layer, so with one DFlash layer all K drafts would be the same token.
    """
    rows = embedding.detach()
    usable = rows.abs().sum(-1) > 0  # [vocab]
    pad = getattr(target_config, "pad_token_id", None)
    if isinstance(pad, int) and 0 <= pad < rows.shape[0] and bool(usable[pad]):
        return pad
    outside = (~vocab.t2d.to(usable.device)) & usable
    if bool(outside.any()):
        return int(outside.nonzero()[-1])
    candidates = usable.nonzero()
    if not len(candidates):
        raise ValueError("the target's embedding is all zeros: no token can serve as a "
                         "draft's mask")
    return int(candidates[-1])


class SharesTargetVocab:
    """What every family's draft model does with the target's token embedding and the draft
    vocabulary: shares the embedding (no copy, never trained, never saved: vLLM shares it),
    keeps d2t/t2d as buffers, and starts lm_head from the target's rows. Mixed into an
    nn.Module whose config has vocab_size, hidden_size and draft_vocab_size."""

    def share_target_vocab(self, config, target_embedding, vocab: DraftVocab) -> None:
        from torch import nn

        weight = getattr(target_embedding, "weight", target_embedding)
        if tuple(weight.shape) != (config.vocab_size, config.hidden_size):
            raise ValueError(f"target embedding is {tuple(weight.shape)}, the config expects "
                             f"[vocab_size={config.vocab_size}, hidden_size={config.hidden_size}]")
        if vocab.size != config.draft_vocab_size or vocab.target_vocab_size != config.vocab_size:
            raise ValueError(f"vocab maps {vocab.size} draft ids over {vocab.target_vocab_size} "
                             f"target ids; the config says {config.draft_vocab_size} over "
                             f"{config.vocab_size}")
        self.embed_tokens = nn.Embedding.from_pretrained(weight.detach(), freeze=True)
        self.register_buffer("d2t", vocab.d2t.clone())
        self.register_buffer("t2d", vocab.t2d.clone())

    @property
    def vocab(self) -> DraftVocab:
        return DraftVocab(self.d2t, self.t2d)

    @torch.no_grad()
    def init_lm_head_from_target(self, target_lm_head: torch.Tensor) -> None:
        """Start lm_head from the target's rows for the draft vocab: a warm start."""
        self.lm_head.weight.copy_(target_lm_head[self.vocab.target_ids.to(target_lm_head.device)])
