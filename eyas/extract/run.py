"""Extraction work units: plan shards over prepared data, extract one shard, assemble the manifest.

Ray-free: `tasks/extract.py` places these on workers; tests call them in-process.
"""
from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq
import torch

from eyas.extract.format import (FORMAT, NormSums, ShardRecord, _write_atomic, finished_shard,
                                 write_shard)
from eyas.extract.stage import Batch, make_batch
from eyas.layout import FINAL_NORM, HiddenStateLayout, Slot, SlotNorms

Forward = Callable[[Batch, list[Slot]], dict]  # (batch, slots) -> {slot: [B, T, H]}


@dataclass(frozen=True)
class ShardSpec:
    name: str
    split: str
    source: str  # a prepared split's Parquet file
    first_row: int
    num_rows: int


def plan_shards(prepare_dir: Path, samples_per_shard: int) -> list[ShardSpec]:
    specs = []
    for split in ("train", "heldout"):
        source = prepare_dir / f"{split}.parquet"
        if not source.exists():
            raise FileNotFoundError(f"{source}: no prepared {split} split; run the prepare stage")
        rows = pq.ParquetFile(source).metadata.num_rows
        for i, first in enumerate(range(0, rows, samples_per_shard)):
            specs.append(ShardSpec(f"shard-{split}-{i:05d}", split, str(source), first,
                                   min(samples_per_shard, rows - first)))
    return specs


def load_samples(spec: ShardSpec) -> list[dict]:
    table = pq.read_table(spec.source, columns=["sample_id", "input_ids", "loss_mask"])
    return table.slice(spec.first_row, spec.num_rows).to_pylist()


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
                    batch_tokens: int) -> dict[str, list[torch.Tensor]]:
    """slot name -> per-sample [T_i, H] tensors, in the order of `samples`."""
    per_sample: dict[str, list] = {s.name: [None] * len(samples) for s in slots}
    for index in _batches(samples, batch_tokens):
        batch = make_batch([samples[i]["input_ids"] for i in index], pad_id)
        captured = forward(batch, list(slots))
        for slot in slots:
            tensor = captured[slot]  # [B, T, H]
            for row, i in enumerate(index):
                per_sample[slot.name][i] = tensor[row, :batch.lengths[row]]
    return per_sample


def extract_shard(spec: ShardSpec, forward: Forward, layout: HiddenStateLayout, out_dir: Path,
                  dtype: torch.dtype, pad_id: int, batch_tokens: int) -> ShardRecord:
    samples = load_samples(spec)
    tensors = capture_samples(samples, forward, layout.slots, pad_id, batch_tokens)
    return write_shard(out_dir, spec.name, spec.split, layout, samples, tensors, dtype)


def probe_slots(num_layers: int) -> list[Slot]:
    """Every layer's output: what lets later stages tell which layers an engine feeds."""
    return [Slot.at_stream_index(i, num_layers) for i in range(num_layers + 1)] + [FINAL_NORM]


def extract_probe(source: Path, count: int, forward: Forward, layout: HiddenStateLayout,
                  out_dir: Path, dtype: torch.dtype, pad_id: int, batch_tokens: int):
    if count <= 0:
        return None
    rows = pq.ParquetFile(source).metadata.num_rows
    spec = ShardSpec("probe", "probe", str(source), 0, min(count, rows))
    samples = load_samples(spec)
    slots = probe_slots(layout.target.num_layers)
    tensors = capture_samples(samples, forward, slots, pad_id, batch_tokens)
    return write_shard(out_dir, "probe", "probe", layout, samples, tensors, dtype)


def pending(specs: list[ShardSpec], out_dir: Path) -> tuple[list[ShardRecord], list[ShardSpec]]:
    """Split into finished shards (checksums verified) and shards still to do."""
    done, todo = [], []
    for spec in specs:
        record = finished_shard(out_dir, spec.name)
        (done.append(record) if record else todo.append(spec))
    return done, todo


def write_manifest(out_dir: Path, layout: HiddenStateLayout, records: list[ShardRecord],
                   dtype: str, extra: dict) -> dict:
    """Aggregate shard norms into the layout's fingerprints and write manifest.json last."""
    sums: dict[str, NormSums] = {}
    for r in records:
        if r.split == "probe":
            continue
        for slot, s in r.norms.items():
            sums.setdefault(slot, NormSums()).merge(s)
    layout = layout.with_norms({k: SlotNorms(round(v.mean, 6), round(v.std, 6))
                                for k, v in sums.items()})
    shards = sorted((r for r in records if r.split != "probe"), key=lambda r: r.name)
    manifest = {
        "format": FORMAT, "dtype": dtype, "layout": layout.to_dict(),
        "target_fingerprint": layout.target.fingerprint,
        "shards": [{k: v for k, v in asdict(r).items() if k != "norms"} for r in shards],
        "probe": next(({k: v for k, v in asdict(r).items() if k != "norms"}
                       for r in records if r.split == "probe"), None),
        "totals": {split: {"samples": sum(r.samples for r in shards if r.split == split),
                           "tokens": sum(r.tokens for r in shards if r.split == split)}
                   for split in ("train", "heldout")},
        "bytes": sum(r.bytes for r in shards), "tensor_bytes": sum(r.tensor_bytes for r in shards),
        **extra,
    }
    _write_atomic(out_dir / "manifest.json", json.dumps(manifest, indent=1).encode())
    return manifest


class OutputLock:
    """Refuse a second extraction into the same directory while one is running."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / ".lock"
        self.handle = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.seek(0)
            holder = self.handle.read().strip() or "another process"
            self.handle.close()
            raise RuntimeError(f"{self.path.parent} is being written by {holder}; wait for it to "
                               "finish or choose another run_dir") from None
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
        self.handle.flush()
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()
