"""Hidden states computed when asked, not read from shards: an online run's (train.source=online)
train split, for the trainer's stream and for the stages after it.

An online extraction directory holds the manifest, the probe set and the held-out split's
shards; its manifest's "online" record says where the prepared data and the target are, and
how the states are computed (dtype, batch size, padding), so `open_split` gives the evaluate
stage, the serve stage and the doctor the same samples an offline extraction would have
stored.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import torch

from eyas.store.format import DatasetFormatError
from eyas.store.reader import ExtractedDataset, Sample
from eyas.extract.shards import capture_samples, _num_rows, _read_prepared
from eyas.fingerprint import digest
from eyas.layout import HiddenStateLayout
from eyas.run_records import MANIFEST_FILE


class PreparedRows:
    """A prepared split's token rows ({sample_id, input_ids, loss_mask}), in dataset order:
    row i is what an offline extraction stores as sample i (`load_samples`' rows, the same
    Python lists), decoded when asked for.

    The columns stay in Arrow buffers, as the Parquet file's row groups give them (no
    combining: a split may hold more tokens than 32-bit list offsets reach): a few bytes a
    token in the driver, every replica and every trainer rank, where the rows as lists of
    Python ints took about 50. `len()` reads the file's metadata, `lengths()` its num_tokens
    column only; the token columns are read at the first row asked for."""

    def __init__(self, prepare_dir: str | Path, split: str):
        self.source = Path(prepare_dir) / f"{split}.parquet"
        if not self.source.exists():
            raise FileNotFoundError(f"{self.source}: no prepared {split} split; run the "
                                    "prepare stage")
        self._len = _num_rows(self.source)
        self._lengths = None  # numpy, from the num_tokens column
        self._table = None  # sample_id, input_ids, loss_mask

    def __len__(self) -> int:
        return self._len

    def lengths(self) -> list[int]:
        """Each row's token count, from the num_tokens column (no token list decoded)."""
        if self._lengths is None:
            table = _read_prepared(self.source, lambda s: pq.read_table(
                s, columns=["num_tokens"]))
            self._lengths = table.column("num_tokens").to_numpy()
        return self._lengths.tolist()

    def num_tokens(self) -> int:
        return sum(self.lengths())

    def _columns(self):
        if self._table is None:
            self._table = _read_prepared(self.source, lambda s: pq.read_table(
                s, columns=["sample_id", "input_ids", "loss_mask"]))
        return self._table

    def sample_ids(self, indices) -> list[str]:
        """The sample ids of rows `indices`, their token lists not decoded."""
        column = self._columns().column("sample_id")
        return [column[self._index(i)].as_py() for i in indices]

    def _index(self, i: int) -> int:
        if not -self._len <= i < self._len:
            raise IndexError(f"row {i} of {self.source} ({self._len} rows)")
        return i % self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(self._len)[i]]
        i, table = self._index(i), self._columns()
        return {"sample_id": table.column("sample_id")[i].as_py(),
                "input_ids": table.column("input_ids")[i].values.to_numpy(
                    zero_copy_only=False).tolist(),
                "loss_mask": table.column("loss_mask")[i].values.to_numpy(
                    zero_copy_only=False).tolist()}

    def __iter__(self) -> Iterator[dict]:
        """Every row in order, a row group's buffers at a time (no Arrow scalar a row)."""
        for batch in self._columns().to_batches():
            ids, mask = batch.column("input_ids"), batch.column("loss_mask")
            id_ends, mask_ends = ids.offsets.to_numpy(), mask.offsets.to_numpy()
            id_values = ids.values.to_numpy(zero_copy_only=False)
            mask_values = mask.values.to_numpy(zero_copy_only=False)
            for j, sample_id in enumerate(batch.column("sample_id").to_pylist()):
                yield {"sample_id": sample_id,
                       "input_ids": id_values[id_ends[j]:id_ends[j + 1]].tolist(),
                       "loss_mask": mask_values[mask_ends[j]:mask_ends[j + 1]].tolist()}


def row_sample(row: dict, slots: dict | None = None) -> Sample:
    """A prepared row as a Sample (with `slots`, its states; without, token ids only)."""
    return Sample(row["sample_id"], torch.tensor(row["input_ids"], dtype=torch.long),
                  torch.tensor(row["loss_mask"], dtype=torch.bool), slots or {})


def compute_samples(rows: list[dict], forward, slots, dtype: torch.dtype, pad_id: int,
                    batch_tokens: int) -> list[Sample]:
    """The target's states for `rows`, one Sample each, in the dtype an extraction stores:
    what a trainer reads from a shard, without the shard."""
    packed = capture_samples(rows, forward, slots, pad_id, batch_tokens, dtype)
    out, start = [], 0
    for row in rows:
        n = len(row["input_ids"])
        out.append(row_sample(row, {k: t[start:start + n].clone() for k, t in packed.items()}))
        start += n
    return out


class SampleList:
    """Samples held in memory, read like an ExtractedDataset split (len, [i], layout)."""

    def __init__(self, layout: HiddenStateLayout, samples: list[Sample]):
        self.layout, self.samples = layout, samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]


def online_record(prepare_dir: Path, target_path: str, model_dtype: str, cfg,
                  layout: HiddenStateLayout, pad_id: int, records) -> dict:
    """The manifest's "online" record: what recomputing a split needs, the prepared data's
    digest (a changed prepare gives another manifest, so training redoes), the splits' sizes
    and the probe's norms for the layout's slots (the stored split a fingerprint can come from)."""
    totals = {}
    for split in ("train", "heldout"):  # from the num_tokens column: no token list decoded
        rows = PreparedRows(prepare_dir, split)
        totals[split] = {"samples": len(rows), "tokens": rows.num_tokens()}
    probe = next((r for r in records if r.split == "probe"), None)
    sums = {name: probe.norms[name] for name in dict.fromkeys(
        [*layout.names, layout.verifier.name]) if probe and name in probe.norms}
    return {"prepare_dir": str(Path(prepare_dir).resolve()), "target_path": str(target_path),
            "model_dtype": model_dtype, "prepared": digest((Path(prepare_dir) / MANIFEST_FILE).read_bytes()),
            "batch_tokens": cfg.batch_tokens, "pad_id": pad_id, "backend": cfg.backend,
            "totals": totals, "norm_sums": sums or {}}


def stored_split(data_dir: str | Path, split: str) -> ExtractedDataset | None:
    """An online extraction's stored `split` (its held-out split: eyas.extract stores it), or
    None where it stored none (the train split; extractions made before it did)."""
    manifest = online_manifest(data_dir)
    return (ExtractedDataset(data_dir, split)
            if manifest is not None and _has_shards(manifest, split) else None)


def _has_shards(manifest: dict, split: str) -> bool:
    return any(s["split"] == split for s in manifest["shards"])


def online_manifest(data_dir: str | Path) -> dict | None:
    """An online extraction directory's manifest, or None (offline)."""
    path = Path(data_dir) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # ExtractedDataset names what is wrong with it
    return manifest if manifest.get("online") else None


def open_split(data_dir: str | Path, split: str, states: bool = True,
               max_samples: int | None = None, device: str = "cpu"):
    """A split of an extraction: the stored shards offline; online, recomputed by the target in
    this process with the extractor's own hooks (`states=False`: token ids only, e.g. for
    prompts). `max_samples`: the first samples only (online, only those are computed). A
    stream from extract.backend=vllm is recomputed here by the HF path: the same slots, within
    the two engines' numerics."""
    manifest = online_manifest(data_dir)
    if manifest is None or split == "probe" or _has_shards(manifest, split):
        return ExtractedDataset(data_dir, split)
    online = manifest["online"]
    layout = HiddenStateLayout.from_dict(manifest["layout"], str(Path(data_dir) / MANIFEST_FILE))
    prepared = PreparedRows(online["prepare_dir"], split)
    wanted = range(len(prepared))[:max_samples]  # the first max_samples, decoded as computed
    if not wanted:
        raise DatasetFormatError(f"{online['prepare_dir']}: the prepared {split!r} split is "
                                 "empty")
    if not states:
        return SampleList(layout, [row_sample(prepared[i]) for i in wanted])
    from eyas.extract.blocks import TargetBlocks, run_blocks, torch_dtype
    from eyas.progress import progress

    stages = [TargetBlocks(online["target_path"], 0, layout.target.num_layers, device,
                           online["model_dtype"])]
    bar = progress(total=len(wanted), desc=f"recompute {split} states", unit="sample")
    samples = []
    for start in range(0, len(wanted), 64):
        chunk = [prepared[i] for i in wanted[start:start + 64]]
        samples += compute_samples(chunk, lambda b, s: run_blocks(stages, b, s), layout.slots,
                                   torch_dtype(manifest["dtype"]), online["pad_id"],
                                   online["batch_tokens"])
        bar.update(len(chunk))
    bar.close()
    return SampleList(layout, samples)
