"""Batches for draft training: from the stored dataset's shards (`StoredData`), or streamed
from the target (`eyas.train.stream.StreamedData`); both give `batches` the same interface.

Order is a function of (seed, epoch) alone, so a resumed run replays exactly the batches an
uninterrupted one would have seen, and N data-parallel ranks see the same global batches as
one worker (each rank a contiguous slice of it). A stream's producer asked for step s computes
exactly the samples `step_indices` puts there: offline and online train on the same batches.
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Iterator

import torch

from eyas.draft.ttt import TTTBatch
from eyas.draft.ttt import collate as collate_samples
from eyas.store.reader import ExtractedDataset


GROUP_BATCHES = 16  # batches per window sorted by length (global_order)


def global_order(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[int]:
    """Epoch `epoch`'s sample order, as consecutive batches of `batch_size`: shuffled, then
    each window of GROUP_BATCHES batches sorted by sample length and cut into batches, whose
    order is shuffled again. A batch pads its samples to its longest: batches of like lengths
    waste little (on SmolLM2's demo data about 40 % of a shuffled batch's rows were padding),
    while the windows keep the data order random."""
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=gen).tolist()
    window = batch_size * GROUP_BATCHES
    grouped = [i for w in range(0, len(order), window)
               for i in sorted(order[w:w + window], key=lambda i: lengths[i])]
    count = steps_per_epoch(len(lengths), batch_size)
    cut = [grouped[b * batch_size:(b + 1) * batch_size] for b in range(count)]
    return [i for b in torch.randperm(count, generator=gen).tolist() for i in cut[b]]


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    return num_samples // batch_size  # drop the ragged last batch: every step is a full batch


def rank_slice(indices: list[int], rank: int, world: int) -> list[int]:
    per = len(indices) // world
    return indices[rank * per:(rank + 1) * per]


def step_indices(lengths: list[int], batch_size: int, seed: int, step: int) -> list[int]:
    """The samples of global step `step` (`lengths`: every training sample's token count):
    its slice of its epoch's order. One step alone: a loop over steps takes `EpochOrder`."""
    return EpochOrder(lengths, batch_size, seed)(step)


class EpochOrder:
    """`step_indices` for consecutive steps, each epoch's order computed once: built per step
    it cost O(N log N) a step, O(N^2) an epoch (hours of Python per epoch at 200k samples)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed
        self.per_epoch = steps_per_epoch(len(lengths), batch_size)
        self.epoch, self.order = None, []

    def __call__(self, step: int) -> list[int]:
        epoch, i = divmod(step, self.per_epoch)
        if epoch != self.epoch:
            self.epoch = epoch
            self.order = global_order(self.lengths, self.batch_size, self.seed, epoch)
        return self.order[i * self.batch_size:(i + 1) * self.batch_size]


class StoredData:
    """The training data of an offline run: run_dir/extract's stored train shards."""

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir)
        self.train = ExtractedDataset(data_dir, "train")
        self.layout = self.train.layout

    def __len__(self) -> int:
        return len(self.train)

    def lengths(self) -> list[int]:
        return self.train.lengths()

    def token_rows(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(input_ids, loss_mask) per training sample: what the draft vocabulary counts."""
        for i in range(len(self.train)):
            yield self.train.tokens(i)

    def samples(self, step: int, rank: int, indices: list[int]):
        return [self.train[i] for i in indices]

    def heldout(self) -> ExtractedDataset:
        return ExtractedDataset(self.data_dir, "heldout", expect_layout=self.layout)


def batches(data, batch_size: int, seed: int, steps: range, rank: int = 0, world: int = 1,
            prefetch: int = 2) -> Iterator[tuple[int, TTTBatch]]:
    """(global step, this rank's part of the batch) for the optimizer steps `steps` (e.g.
    range(resumed, total)), from `data` (StoredData or eyas.train.stream.StreamedData).

    A background thread reads ahead `prefetch` batches, so shard reads (or, streamed, the
    wait for the object store) overlap compute.
    """
    if batch_size % world:
        raise ValueError(f"train.batch_size={batch_size} is not divisible by "
                         f"train.num_workers={world}")
    num = len(data)
    if steps_per_epoch(num, batch_size) == 0:
        raise ValueError(f"{num} training samples < train.batch_size={batch_size}")

    order = EpochOrder(data.lengths(), batch_size, seed)

    def produce():
        for step in steps:
            mine = rank_slice(order(step), rank, world)
            batch = collate_samples(data.samples(step, rank, mine), data.layout)
            batch.sample_ids = torch.tensor(mine, dtype=torch.long)  # TargetLabelCache's keys
            yield step, batch

    if prefetch <= 0:
        yield from produce()
        return
    q: queue.Queue = queue.Queue(maxsize=prefetch)
    done = object()

    def worker():
        # one OpenMP thread here (the count is per thread): a second thread team copying
        # batches would fight the training step's team for the cores
        torch.set_num_threads(1)
        try:
            for item in produce():
                q.put(item)
        except BaseException as e:  # surfaced in the consumer
            q.put(e)
        q.put(done)

    threading.Thread(target=worker, daemon=True).start()
    while (item := q.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


