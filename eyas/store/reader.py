"""Reading extracted hidden states: memory-mapped, random access by sample, checked at the door.

The reader is where a dataset meets its consumer (trainer, evaluator, doctor). It checks the
format, each file's presence, size and envelope (`verify="sizes"`, the default: it reads heads
and tails, never the data, so an open costs the same at any size), or every file's checksum
on demand (`verify="full"`: a stage that resumes has the pipeline check them, caching what it
verified); and, when the caller says what it expects, the layout and the target: a mismatch is
an error naming both sides. A damaged file is an error naming the file and the fix, never a
bare pyarrow or JSON error.

Token ids and loss masks are memory-mapped from each shard's safetensors, as its hidden states
are, when one of the shard's samples is read; the KEEP_MAPPED most recently read shards stay
mapped (a store written before the token tensors decodes a shard's Parquet columns instead, and
drops them once KEEP_DECODED other shards have been read since). An open store holds its index,
flat arrays of a few numbers a sample, not its tokens (as Python lists they took about 50 bytes
a token in every worker; as Arrow columns of the whole store, 5) nor an object a shard (about
15 KiB each).
"""
from __future__ import annotations

import json
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyas.store.format import (FORMAT, REDO, TOKENS, DatasetFormatError, dequantize,
                               file_problem, read_rows, read_safetensors_mmap, will_need)
from eyas.files import sha256_file
from eyas.layout import HiddenStateLayout, TargetIdentity
from eyas.run_records import MANIFEST_FILE


@dataclass
class Sample:
    sample_id: str
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool
    slots: dict[str, torch.Tensor]  # slot name -> [T, H] (stored dtype, a view of the mmap;
    # FP8 stores: bfloat16, dequantized)


class _Shard:
    """One shard's files: its hidden states (and token tensors) memory-mapped when a sample is
    asked for and unmapped again by the dataset (`ExtractedDataset.KEEP_MAPPED`); a store
    written before the token tensors decodes its token columns instead (dropped again after
    `ExtractedDataset.KEEP_DECODED`). Its index (ids, offsets, lengths) is the dataset's, in
    flat arrays: a shard held open cost about 15 KiB however few samples it held."""

    def __init__(self, directory: Path, name: str):
        self.directory, self.name = directory, name
        self.path = directory / f"{name}.parquet"
        self.maps = None  # (slot tensors, their scales, token tensors or None) while mapped
        self.columns = None  # (input_ids, loss_mask) as Arrow holds them, while decoded

    def read(self, columns: list[str]) -> pa.Table:
        try:
            return pq.read_table(self.path, columns=columns)
        except (OSError, pa.ArrowException) as e:  # e.g. "Parquet magic bytes not found"
            raise DatasetFormatError(f"{self.path}: unreadable ({e}): the file is damaged; "
                                     f"{REDO}") from None

    def mapped(self) -> tuple[dict, dict, tuple | None]:
        maps = self.maps  # one read: the dataset may unmap it from another thread
        if maps is None:
            with warnings.catch_warnings():  # read-only mmap: tensors are views, never written
                warnings.simplefilter("ignore", UserWarning)
                stored, _ = read_safetensors_mmap(self.directory / f"{self.name}.safetensors")
            tensors, scales = dequantize(stored)
            # memory-mapped token tensors (eyas.store.format.TOKENS); None: a store written
            # before them, whose Parquet columns are decoded instead
            packed = (None if TOKENS["input_ids"] not in stored else
                      (stored[TOKENS["input_ids"]], stored[TOKENS["loss_mask"]]))
            maps = self.maps = (tensors, scales, packed)
        return maps

    @property
    def packed(self) -> tuple | None:
        return self.mapped()[2]

    def tokens(self, i: int, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row i's tokens (its rows start:start+n of the shard's tensors)."""
        packed = self.mapped()[2]
        if packed is not None:
            return (will_need(packed[0][start:start + n]).long(),
                    will_need(packed[1][start:start + n]).bool())
        columns = self.columns  # one read: the dataset may drop them from another thread
        if columns is None:
            table = self.read(["input_ids", "loss_mask"])
            columns = self.columns = (table.column("input_ids").combine_chunks(),
                                      table.column("loss_mask").combine_chunks())
        ids = columns[0][i].values.to_numpy(zero_copy_only=False)
        mask = columns[1][i].values.to_numpy(zero_copy_only=False)
        return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)

    def sample(self, sample_id: str, i: int, start: int, n: int) -> Sample:
        tensors, scales, _ = self.mapped()
        for name, t in tensors.items():  # every slot's rows asked for before any is read
            will_need(t[start:start + n])
            if name in scales:
                will_need(scales[name][start:start + n])
        return Sample(sample_id, *self.tokens(i, start, n),
                      {k: read_rows(t, scales.get(k), start, n) for k, t in tensors.items()})


class ExtractedDataset:
    """Samples of one split ("train", "heldout" or "probe") of an extraction directory."""

    KEEP_DECODED = 8  # shards whose token columns stay decoded (the most recently read)
    KEEP_MAPPED = 64  # shards whose files stay mapped (the most recently read)

    def __init__(self, directory: str | Path, split: str = "train",
                 expect_layout: HiddenStateLayout | None = None,
                 expect_target: TargetIdentity | None = None, verify: str | bool = "sizes"):
        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST_FILE
        if not manifest_path.exists():
            raise DatasetFormatError(f"{self.directory}: no manifest.json; not an extraction "
                                     "output, or the extract stage has not finished")
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except ValueError as e:
            raise DatasetFormatError(f"{manifest_path}: unreadable ({e}): the file is damaged; "
                                     "re-run the pipeline: the extract stage resumes and "
                                     "writes it again") from None
        if self.manifest.get("format") != FORMAT:
            raise DatasetFormatError(f"{manifest_path}: format {self.manifest.get('format')!r} "
                                     f"is not {FORMAT!r}: an extraction this eyas does not "
                                     "read; extract again into a new run directory")
        self.layout = HiddenStateLayout.from_dict(self.manifest["layout"], str(manifest_path))
        if expect_layout is not None:
            expect_layout.check_matches(self.layout, "the caller's layout", str(self.directory))
        if expect_target is not None:
            wrong = expect_target.mismatches(self.layout.target)
            if wrong:
                raise DatasetFormatError(
                    f"{self.directory} was extracted from another target than expected "
                    f"(expected vs dataset): {'; '.join(wrong)}")
        records = ([self.manifest["probe"]] if split == "probe" and self.manifest["probe"] else
                   [s for s in self.manifest["shards"] if s["split"] == split])
        if not records:
            raise DatasetFormatError(f"{self.directory}: no {split!r} shards")
        if verify not in ("sizes", "full", False):
            raise ValueError(f"verify={verify!r}: one of 'sizes', 'full', False")
        for r in records if verify else ():
            for fname, digest in r["files"].items():
                path = self.directory / fname
                problem = file_problem(path, (r.get("sizes") or {}).get(fname))
                if problem is not None:
                    raise DatasetFormatError(f"{path}: {problem}; the file changed after "
                                             f"extraction: {REDO}")
                if verify == "full" and sha256_file(path) != digest:
                    raise DatasetFormatError(f"{path}: checksum mismatch; the file changed "
                                             f"after extraction: {REDO}")
        self.shards = [_Shard(self.directory, r["name"]) for r in records]
        # the index: flat arrays over every sample (a few bytes each), not objects a shard
        ids, offsets, lengths, counts = [], [], [], []
        for shard in self.shards:
            table = shard.read(["sample_id", "offset", "length"])
            ids.append(table.column("sample_id").combine_chunks())
            offsets.append(table.column("offset").to_numpy())
            lengths.append(table.column("length").to_numpy())
            counts.append(table.num_rows)
        self.sample_ids = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
        self.offsets = np.concatenate(offsets).astype(np.int64)
        self.sample_lengths = np.concatenate(lengths).astype(np.int64)
        self.shard_of = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        self.first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.mapped: OrderedDict[int, None] = OrderedDict()  # shards mapped, oldest first
        self.decoded: OrderedDict[int, None] = OrderedDict()  # shards with columns, oldest first
        self.lock = threading.Lock()  # a prefetch thread and its consumer may read at once

    def __len__(self) -> int:
        return len(self.shard_of)

    def lengths(self) -> list[int]:
        """Every sample's token count, in dataset order (read from the shards' index)."""
        return self.sample_lengths.tolist()

    def _shard(self, shard: int) -> _Shard:
        """The shard, counted as read last: the least recently read past KEEP_MAPPED are
        unmapped, past KEEP_DECODED drop their decoded columns (a store written before the
        token tensors)."""
        with self.lock:
            for lru, keep, drop in ((self.mapped, self.KEEP_MAPPED, "maps"),
                                    (self.decoded, self.KEEP_DECODED, "columns")):
                if drop == "columns" and self.shards[shard].packed is not None:
                    continue
                lru[shard] = None
                lru.move_to_end(shard)
                while len(lru) > keep:
                    setattr(self.shards[lru.popitem(last=False)[0]], drop, None)
        return self.shards[shard]

    def _where(self, i: int) -> tuple[_Shard, int, int, int]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} of {len(self)}")
        i %= len(self)
        shard = int(self.shard_of[i])
        return (self._shard(shard), i - int(self.first[shard]), int(self.offsets[i]),
                int(self.sample_lengths[i]))

    def __getitem__(self, i: int) -> Sample:
        shard, row, start, n = self._where(i)
        return shard.sample(self.sample_ids[i].as_py(), row, start, n)

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample i's (input_ids, loss_mask) alone: no hidden state is read (an FP8 store's
        are not dequantized), what counting the vocabulary over every sample needs."""
        shard, row, start, n = self._where(i)
        return shard.tokens(row, start, n)

    def draft_inputs(self, sample: Sample) -> torch.Tensor:
        """[T, n_slots * H]: the layout's draft-input slots concatenated in layout order."""
        return torch.cat([sample.slots[name] for name in self.layout.names], dim=-1)

    def verifier(self, sample: Sample) -> torch.Tensor:
        return sample.slots[self.layout.verifier.name]  # [T, H]
