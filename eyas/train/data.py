"""Batches for draft training, read from the stored dataset's shards.

Order is a function of (seed, epoch) alone, so a resumed run replays exactly the batches an
uninterrupted one would have seen, and N data-parallel ranks see the same global batches as
one worker (each rank a contiguous slice of it).
"""
from __future__ import annotations

import queue
import threading
from typing import Iterator

import torch

from eyas.draft.ttt import TTTBatch
from eyas.draft.ttt import collate as collate_samples
from eyas.dataset.reader import ExtractedDataset


def global_order(num_samples: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(num_samples, generator=gen).tolist()


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    return num_samples // batch_size  # drop the ragged last batch: every step is a full batch


def rank_slice(indices: list[int], rank: int, world: int) -> list[int]:
    per = len(indices) // world
    return indices[rank * per:(rank + 1) * per]


def collate(ds: ExtractedDataset, indices: list[int], dtype=torch.float32) -> TTTBatch:
    return collate_samples([ds[i] for i in indices], ds.layout, dtype)


def batches(ds: ExtractedDataset, batch_size: int, seed: int, start_step: int, total_steps: int,
            rank: int = 0, world: int = 1, prefetch: int = 2) -> Iterator[tuple[int, TTTBatch]]:
    """(global step, this rank's part of the batch) for steps start_step..total_steps-1.

    A background thread reads ahead `prefetch` batches, so shard reads overlap compute.
    """
    if batch_size % world:
        raise ValueError(f"train.batch_size={batch_size} is not divisible by "
                         f"train.num_workers={world}")
    per_epoch = steps_per_epoch(len(ds), batch_size)
    if per_epoch == 0:
        raise ValueError(f"{len(ds)} training samples < train.batch_size={batch_size}")

    def produce():
        for step in range(start_step, total_steps):
            epoch, i = divmod(step, per_epoch)
            order = global_order(len(ds), seed, epoch)
            chunk = order[i * batch_size:(i + 1) * batch_size]
            yield step, collate(ds, rank_slice(chunk, rank, world))

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


