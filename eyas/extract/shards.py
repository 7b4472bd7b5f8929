"""Extraction work units: plan shards over prepared data, extract one shard, assemble the manifest.

Ray-free: `tasks/extract.py` places these on workers; tests call them in-process.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyas.store.format import FP8, DatasetFormatError, ShardRecord
from eyas.store.writer import finished_shard, write_shard
from eyas.extract.blocks import Batch, make_batch
from eyas.layout import FINAL_NORM, HiddenStateLayout, Slot

Forward = Callable[[Batch, list[Slot]], dict]  # (batch, slots) -> {slot: [B, T, H]}


@dataclass(frozen=True)
class ShardSpec:
    name: str
    split: str
    source: str  # a prepared split's Parquet file
    first_row: int
    num_rows: int


def _read_prepared(source, read):
    """read(source), a damaged prepared split named with the fix instead of pyarrow's bare
    "Parquet magic bytes not found"."""
    try:
        return read(source)
    except (OSError, pa.ArrowException) as e:
        raise DatasetFormatError(f"{source}: unreadable prepared split ({e}): the file is "
                                 "damaged; re-run the pipeline: the prepare stage is redone"
                                 ) from None


def _num_rows(source) -> int:
    return _read_prepared(source, lambda s: pq.ParquetFile(s).metadata.num_rows)


def plan_shards(prepare_dir: Path, samples_per_shard: int) -> list[ShardSpec]:
    specs = []
    for split in ("train", "heldout"):
        source = prepare_dir / f"{split}.parquet"
        if not source.exists():
            raise FileNotFoundError(f"{source}: no prepared {split} split; run the prepare stage")
        rows = _num_rows(source)
        for i, first in enumerate(range(0, rows, samples_per_shard)):
            specs.append(ShardSpec(f"shard-{split}-{i:05d}", split, str(source), first,
                                   min(samples_per_shard, rows - first)))
    return specs


def load_samples(spec: ShardSpec) -> list[dict]:
    """The shard's rows of its prepared split, decoding only the row groups that hold them
    (the prepare stage writes 512 rows a group): a shard costs the same at any data size,
    where reading the whole split for each shard cost O(N^2) an extraction."""
    def read(source):
        f = pq.ParquetFile(source)
        groups, start, first = [], 0, None
        for g in range(f.metadata.num_row_groups):
            rows = f.metadata.row_group(g).num_rows
            if start < spec.first_row + spec.num_rows and start + rows > spec.first_row:
                groups.append(g)
                first = start if first is None else first
            start += rows
        table = f.read_row_groups(groups, columns=["sample_id", "input_ids", "loss_mask"])
        return table.slice(spec.first_row - (first or 0), spec.num_rows)

    return _read_prepared(spec.source, read).to_pylist()


def _batches(samples: list[dict], batch_tokens: int):
    """Group samples of similar length (less padding) into batches of <= batch_tokens."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]["input_ids"]))
    batch, longest = [], 0
    for i in order:
        n = len(samples[i]["input_ids"])
        if batch and max(longest, n) * (len(batch) + 1) > batch_tokens:
            yield batch
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, n)
    if batch:
        yield batch


def capture_samples(samples: list[dict], forward: Forward, slots, pad_id: int,
                    batch_tokens: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """slot name -> token-packed [sum T_i, H] in the order of `samples`, in `dtype` (FP8:
    bfloat16, which the writer quantizes).

    Each batch's real rows are copied straight into one preallocated buffer per slot, so
    batch outputs are freed at once and nothing is concatenated or cast afterwards.
    """
    lengths = [len(s["input_ids"]) for s in samples]
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    packed: dict[str, torch.Tensor] = {}
    for index in _batches(samples, batch_tokens):
        batch = make_batch([samples[i]["input_ids"] for i in index], pad_id)
        captured = forward(batch, list(slots))
        for slot in slots:
            tensor = captured[slot]  # [B, T, H]
            if slot.name not in packed:
                packed[slot.name] = torch.empty(sum(lengths), tensor.shape[-1],
                                                dtype=torch.bfloat16 if dtype == FP8 else dtype)
            for row, i in enumerate(index):
                packed[slot.name][starts[i]:starts[i] + lengths[i]] = tensor[row, :lengths[i]]
    return packed


def bare_forward_rate(spec: ShardSpec, forward: Forward, pad_id: int, batch_tokens: int
                      ) -> float | None:
    """Tokens/s of the target's forward alone over one shard's batches, as extraction batches
    them, capturing nothing and writing nothing: the rate extraction is measured against.
    None where the backend has no forward that captures nothing (it answers None: vLLM's)."""
    samples = load_samples(spec)
    started = time.perf_counter()
    for index in _batches(samples, batch_tokens):
        if forward(make_batch([samples[i]["input_ids"] for i in index], pad_id), []) is None:
            return None
    seconds = time.perf_counter() - started
    return sum(len(s["input_ids"]) for s in samples) / seconds if seconds > 0 else 0.0


@dataclass(frozen=True)
class ShardWriter:
    """How shards are captured and written: the layout's slots, stored in `dtype` under
    `out_dir`, batches padded with `pad_id` and cut at `batch_tokens` tokens per forward."""

    layout: HiddenStateLayout
    out_dir: Path
    dtype: torch.dtype
    pad_id: int
    batch_tokens: int

    def capture(self, samples: list[dict], forward: Forward, slots: list[Slot]) -> dict:
        return capture_samples(samples, forward, slots, self.pad_id, self.batch_tokens,
                               self.dtype)

    def write(self, name: str, split: str, samples: list[dict], tensors: dict) -> ShardRecord:
        return write_shard(self.out_dir, name, split, self.layout, samples, tensors, self.dtype)


def extract_shard(spec: ShardSpec, forward: Forward, writer: ShardWriter,
                  compute_lock: threading.Lock | None = None) -> ShardRecord:
    """Capture one shard, then write it. With a `compute_lock` shared by two threads, one
    shard is written while the next is computed (write-behind): the target never waits on
    the disk, and the lock keeps two forwards from competing for the device.

    A shard already complete on disk (checksums verified) is returned as it is: a retried task
    whose worker finished the shard but died (its node lost) before the driver heard of it
    does not write it again."""
    done = finished_shard(writer.out_dir, spec.name)
    if done is not None:
        return done
    samples = load_samples(spec)
    with compute_lock or contextlib.nullcontext():
        tensors = writer.capture(samples, forward, writer.layout.slots)
    return writer.write(spec.name, spec.split, samples, tensors)


def probe_slots(num_layers: int) -> list[Slot]:
    """Every layer's output: what lets later stages tell which layers an engine feeds."""
    return [Slot.at_stream_index(i, num_layers) for i in range(num_layers + 1)] + [FINAL_NORM]


def extract_probe(source: Path, count: int, forward: Forward, writer: ShardWriter):
    """The first `count` samples of `source` with every layer's output (`probe_slots`)."""
    if count <= 0:
        return None
    rows = _num_rows(source)
    spec = ShardSpec("probe", "probe", str(source), 0, min(count, rows))
    samples = load_samples(spec)
    tensors = writer.capture(samples, forward, probe_slots(writer.layout.target.num_layers))
    return writer.write("probe", "probe", samples, tensors)


def pending(specs: list[ShardSpec], out_dir: Path) -> tuple[list[ShardRecord], list[ShardSpec]]:
    """Split into finished shards (checksums verified) and shards still to do."""
    done, todo = [], []
    for spec in specs:
        record = finished_shard(out_dir, spec.name)
        (done.append(record) if record else todo.append(spec))
    return done, todo
