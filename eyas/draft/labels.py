"""The ce loss's labels: what the target's head says at a batch's scored rows (TargetLabels),
and the per-sample cache that computes them once per training sample (TargetLabelCache),
shared over data-parallel ranks while it fills. eyas.draft.ttt's loss reads them."""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import nn


class TargetLabels(NamedTuple):
    """What the ce loss trains on, per row of a batch ([B, T] each): the target's greedy
    token in draft ids (-1 where the draft cannot say it) and its most likely token in the
    draft vocab."""

    choice: torch.Tensor
    best: torch.Tensor


def _labels_of(logits: torch.Tensor, vocab, t2d: torch.Tensor):
    """(choice [N] in draft ids, -1 where the draft cannot say it; the head's logits over the
    draft vocab [N, draft_vocab]) of the target head's logits [N, V]. The argmaxes read the
    head's own dtype (a cast to float32 is exact: the same argmax)."""
    # max's indices are argmax's (the first of a tie), and on CPU 3-4x as fast as argmax
    return vocab.to_draft(logits.max(-1).indices), logits[:, t2d]


def _lengths(batch) -> list[int]:
    b, t = batch.input_ids.shape
    return (torch.full((b,), t) if batch.attention_mask is None
            else batch.attention_mask.sum(1)).tolist()


class TargetLabelCache:
    """The ce loss's labels (TargetLabels) per training sample, computed by the target's head
    once and read back in every later epoch: the head is frozen and a sample's verifier
    states are the same each time it is drawn, so its labels are too, to the bit (on SmolLM2
    the head was about a seventh of a step: 1.11x tokens/s at 3 epochs, docs/recipe.md). Keyed by
    TTTBatch.sample_ids; two int32 per token, up to `max_bytes` (train.target_cache_gib);
    the samples past that are computed afresh each time they come.

    `shared` (data-parallel ranks, each drawing its slice of the global batch): `labels`
    stores nothing itself; the ranks then exchange what each computed (`contribution` ->
    all-gather -> `receive`, or `share`) and every rank stores the whole global batch's, in
    its order, so every rank's cache holds what one worker's would (a rank keeping only its
    own samples would hit about 1/world of the time in later epochs). The exchange is a
    collective: every rank runs it at the same steps, those where the ranks' `wanted`,
    summed over ranks, is above 0 (none once every sample that fits is held)."""

    def __init__(self, max_bytes: int, shared: bool = False):
        self.max_bytes, self.bytes = max_bytes, 0
        self.samples: dict[int, torch.Tensor] = {}  # sample id -> [n, 2] int32 (choice, best)
        self.computed = 0  # samples the head ran on (a cached one counts once)
        self.shared = shared
        self.fresh: list[tuple[int, torch.Tensor]] = []  # shared: this step's, to exchange

    def wanted(self, batch) -> int:
        """The samples of `batch` not held that the cache has room left for: while any rank
        has one, the ranks exchange their step's labels."""
        room = self.max_bytes - self.bytes
        return sum(i not in self.samples and 8 * n <= room
                   for i, n in zip(batch.sample_ids.tolist(), _lengths(batch)))

    def _store(self, sample: int, whole: torch.Tensor) -> None:
        if sample not in self.samples and self.bytes + whole.nbytes <= self.max_bytes:
            self.samples[sample] = whole
            self.bytes += whole.nbytes

    def labels(self, batch, target_head: nn.Module, vocab, t2d: torch.Tensor,
               scored: torch.Tensor) -> TargetLabels:
        """The batch's (a TTTBatch's) TargetLabels at its `scored` [B, T] rows (-1 and 0
        elsewhere): which rows a sample has scored is its own (its loss mask and length) and
        the run's (train.loss_tokens), the same each time it is drawn, so the head computes no
        more rows than _target_side would in the first epoch, and none after."""
        if batch.sample_ids is None:
            raise ValueError("TargetLabelCache needs the batch's sample_ids (the training "
                             "samples' indices, which eyas.train.data.batches sets)")
        b, t = batch.input_ids.shape
        lengths = _lengths(batch)
        ids = batch.sample_ids.tolist()
        found = {row: self.samples[i] for row, i in enumerate(ids) if i in self.samples}
        missing = [row for row in range(b) if row not in found]
        self.fresh = []
        if missing:
            with torch.no_grad():
                where = [scored[row, :lengths[row]] for row in missing]
                rows = torch.cat([batch.verifier[row, :lengths[row]][w]
                                  for row, w in zip(missing, where)])
                choice, in_draft = _labels_of(target_head(rows), vocab, t2d)
                pairs = torch.stack([choice, in_draft.max(-1).indices], 1).to(torch.int32).cpu()
            for row, w, part in zip(missing, where, pairs.split([int(w.sum()) for w in where])):
                whole = torch.tensor([-1, 0], dtype=torch.int32).repeat(lengths[row], 1)
                whole[w.cpu()] = part
                found[row] = whole
                self.computed += 1
                if self.shared:
                    self.fresh.append((ids[row], whole))
                else:
                    self._store(ids[row], whole)
        choice = torch.full((b, t), -1, dtype=torch.long)
        best = torch.zeros(b, t, dtype=torch.long)
        for row, whole in found.items():
            choice[row, :lengths[row]] = whole[:, 0]
            best[row, :lengths[row]] = whole[:, 1]
        device = batch.input_ids.device
        return TargetLabels(choice.to(device), best.to(device))

    def contribution(self) -> torch.Tensor:
        """This rank's part of the exchange, one int32 tensor: the count k of the labels it
        computed this step that could still fit, k (sample id, tokens) pairs, their labels."""
        room = self.max_bytes - self.bytes
        mine = [(i, w) for i, w in self.fresh if w.nbytes <= room]
        head = torch.tensor([len(mine)] + [v for i, w in mine for v in (i, len(w))],
                            dtype=torch.int32)
        return torch.cat([head] + [w.flatten() for _, w in mine])

    def receive(self, parts: list[torch.Tensor]) -> None:
        """Store every rank's `contribution` (`parts`, in rank order: the global batch's)."""
        for part in parts:
            part = part.cpu()
            k = int(part[0])
            meta = part[1:1 + 2 * k].view(k, 2).tolist()
            body = part[1 + 2 * k:].split([2 * n for _, n in meta])
            for (sample, n), flat in zip(meta, body):
                self._store(sample, flat.view(n, 2).clone())
        self.fresh = []

    def share(self, all_gather: Callable[[torch.Tensor], list[torch.Tensor]]) -> None:
        """Exchange this step's labels with the other ranks (`all_gather`: every rank's 1-D
        tensor, in rank order) and store them all. A collective: see the class."""
        self.receive(all_gather(self.contribution()))
