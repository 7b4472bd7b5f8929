"""Writing the stored dataset: shards, the probe set and the manifest, each file visible only
when complete (eyas.files.atomic_write), with its size and checksum recorded so a resumed or
re-run extraction redoes exactly what is missing or damaged.
"""
from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyas.store.format import (FORMAT, META_LAYOUT, SAFETENSORS_DTYPE_NAMES, NormSums,
                                 ShardRecord, file_problem, quantize, token_tensors)
from eyas.files import TMP_PREFIX, atomic_write, sha256_file
from eyas.layout import HiddenStateLayout, SlotNorms
from eyas.run_records import MANIFEST_FILE


NORM_ROWS = 4096  # token rows a norm is computed over at once (128 MiB of float32 at 8192)


def write_shard(out_dir: Path, name: str, split: str, layout: HiddenStateLayout,
                samples: list[dict], packed: dict[str, torch.Tensor],
                dtype: torch.dtype | None = None) -> ShardRecord:
    """samples: {sample_id, input_ids, loss_mask}; packed[slot]: [sum T_i, H], sample order;
    stored in `dtype` (eyas.store.format.quantize; None: as packed). The norms are the
    packed values'."""
    lengths = [len(s["input_ids"]) for s in samples]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    norms = {}
    for slot, tensor in packed.items():  # in row chunks: no float32 copy of a whole slot
        norms[slot] = NormSums()
        for start in range(0, tensor.shape[0], NORM_ROWS):
            norms[slot].add(tensor[start:start + NORM_ROWS].float().norm(dim=-1))
    stored = packed if dtype is None else quantize(packed, dtype)
    tensors_blob = safetensors_chunks({**stored, **token_tensors(samples)},
                                      {"format": FORMAT, "layout": layout.to_json()})
    table = pa.table({
        "sample_id": pa.array([s["sample_id"] for s in samples], pa.string()),
        "input_ids": pa.array([list(map(int, s["input_ids"])) for s in samples],
                              pa.list_(pa.int32())),
        "loss_mask": pa.array([list(map(int, s["loss_mask"])) for s in samples],
                              pa.list_(pa.int8())),
        "offset": pa.array(offsets, pa.int64()),
        "length": pa.array(lengths, pa.int64()),
    }).replace_schema_metadata({META_LAYOUT: layout.to_json().encode(),
                                b"eyas.format": FORMAT.encode(), b"eyas.split": split.encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    files = {f"{name}.safetensors": atomic_write(out_dir / f"{name}.safetensors", tensors_blob),
             f"{name}.parquet": atomic_write(out_dir / f"{name}.parquet",
                                              sink.getvalue().to_pybytes())}
    tensor_bytes = sum(t.numel() * t.element_size() for t in stored.values())
    sizes = {f: (out_dir / f).stat().st_size for f in files}
    record = ShardRecord(name, split, len(samples), int(sum(lengths)), files,
                         sum(sizes.values()), tensor_bytes, norms, sizes)
    atomic_write(out_dir / f"{name}.json", json.dumps(record.to_dict(), indent=1).encode())
    return record


def finished_shard(out_dir: Path, name: str, verify: bool = True) -> ShardRecord | None:
    """The shard's record if it is complete (and its sizes and checksums match), else None."""
    marker = out_dir / f"{name}.json"
    if not marker.exists():
        return None
    try:
        record = ShardRecord.from_dict(json.loads(marker.read_text()))
    except (ValueError, TypeError, KeyError):  # the record itself is damaged
        marker.unlink()
        return None
    for fname, digest in record.files.items():
        path = out_dir / fname
        if (file_problem(path, record.sizes.get(fname)) is not None
                or (verify and sha256_file(path) != digest)):
            marker.unlink()  # a damaged shard is redone, never trusted
            return None
    return record


def remove_partials(out_dir: Path) -> int:
    stale = list(out_dir.glob(f"{TMP_PREFIX}*"))
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def safetensors_chunks(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list:
    """The safetensors format as a list of buffers (header, then each tensor's memory, no
    copies), written deterministically (sorted header): equal tensors give equal files and
    equal checksums on every run."""
    header, views, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = memoryview(t.view(torch.uint8).numpy()).cast("B") if t.numel() else b""
        header[name] = {"dtype": SAFETENSORS_DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        views.append(data)
        offset += len(data)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # data starts 8-byte aligned, as the format asks
    return [len(head).to_bytes(8, "little") + head, *views]


def write_manifest(out_dir: Path, layout: HiddenStateLayout, records: list[ShardRecord],
                   dtype: str, extra: dict, streamed: dict | None = None,
                   target_dtype: str | None = None) -> dict:
    """Aggregate shard norms into the layout's fingerprints and write manifest.json last;
    returns it with `extra` (this run's speed and resumed shards, which stay out of the file:
    a resumed or repaired extraction of the same data writes the same manifest, so what was
    made from it stays up to date). `streamed`: an online run's record (no train or held-out
    shards; its "totals" and "norms", the probe's, stand in for theirs)."""
    sums: dict[str, NormSums] = {}
    for r in sorted(records, key=lambda r: r.name):  # one summation order: equal manifests
        if r.split == "probe":
            continue
        for slot, s in r.norms.items():
            sums.setdefault(slot, NormSums()).merge(s)
    if streamed is not None:
        sums = streamed.pop("norm_sums")
    layout = layout.with_norms({k: SlotNorms(round(v.mean, 6), round(v.std, 6))
                                for k, v in sums.items()})
    shards = sorted((r for r in records if r.split != "probe"), key=lambda r: r.name)
    manifest = {
        "format": FORMAT, "dtype": dtype, "layout": layout.to_dict(),
        "target_dtype": target_dtype,  # what the target computed in; None: not recorded
        "target_fingerprint": layout.target.fingerprint,
        "shards": [{k: v for k, v in asdict(r).items() if k != "norms"} for r in shards],
        "probe": next(({k: v for k, v in asdict(r).items() if k != "norms"}
                       for r in records if r.split == "probe"), None),
        "totals": {split: {"samples": sum(r.samples for r in shards if r.split == split),
                           "tokens": sum(r.tokens for r in shards if r.split == split)}
                   for split in ("train", "heldout")},
        "bytes": sum(r.bytes for r in shards), "tensor_bytes": sum(r.tensor_bytes for r in shards),
    }
    if streamed is not None:
        manifest["totals"] = streamed.pop("totals")
        manifest["online"] = streamed
    atomic_write(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=1))
    return {**manifest, **extra}


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
