"""Batches for draft training, read from extracted shards, and the target parts the draft uses.

Order is a function of (seed, epoch) alone, so a resumed run replays exactly the batches an
uninterrupted one would have seen, and N data-parallel ranks see the same global batches as
one worker (each rank a contiguous slice of it).
"""
from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from eyas.draft.model import RMSNorm
from eyas.draft.ttt import TargetHead, TTTBatch
from eyas.draft.ttt import collate as collate_samples
from eyas.extract.reader import ExtractedDataset


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
    config = json.loads((target_dir / "config.json").read_text())
    config = config.get("text_config", config)
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
