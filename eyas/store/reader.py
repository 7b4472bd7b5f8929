"""Reading extracted hidden states: memory-mapped, random access by sample, checked at the door.

The reader is where a dataset meets its consumer (trainer, evaluator, doctor). It checks the
format, each file's presence, size and envelope (`verify="sizes"`, the default: it reads heads
and tails, never the data, so an open costs the same at any size), or every file's checksum
on demand (`verify="full"`: a stage that resumes has the pipeline check them, caching what it
verified); and, when the caller says what it expects, the layout and the target: a mismatch is
an error naming both sides. A damaged file is an error naming the file and the fix, never a
bare pyarrow or JSON error.

Token ids and loss masks are memory-mapped from each shard's safetensors, as its hidden states
are (a store written before they were stored there decodes a shard's Parquet columns when one
of its samples is read, and drops them once KEEP_DECODED other shards have been read since):
an open store holds its index (a few numbers a sample), not its tokens (as Python lists they
took about 50 bytes a token in every worker; as Arrow columns of the whole store, 5).
"""
from __future__ import annotations

import json
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyas.store.format import (FORMAT, REDO, TOKENS, DatasetFormatError, dequantize,
                               file_problem, read_rows, read_safetensors_mmap)
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
    """One shard: its index (sample ids, offsets, lengths) read at open, its hidden states
    memory-mapped, its token columns decoded when a sample is asked for (and dropped again by
    the dataset: `ExtractedDataset.KEEP_DECODED`), so an open store's memory does not grow
    with its tokens."""

    def __init__(self, directory: Path, name: str):
        self.path = directory / f"{name}.parquet"
        table = self._read(["sample_id", "offset", "length"])
        self.sample_ids = table.column("sample_id").to_pylist()
        self.offsets = table.column("offset").to_pylist()
        self.lengths = table.column("length").to_pylist()
        self.columns = None  # (input_ids, loss_mask) as Arrow holds them, while decoded
        with warnings.catch_warnings():  # read-only mmap: tensors are views, never written
            warnings.simplefilter("ignore", UserWarning)
            stored, _ = read_safetensors_mmap(directory / f"{name}.safetensors")
        self.tensors, self.scales = dequantize(stored)
        # memory-mapped token tensors (eyas.store.format.TOKENS); None: a store written before
        # them, whose Parquet columns are decoded instead
        self.packed = (None if TOKENS["input_ids"] not in stored else
                       (stored[TOKENS["input_ids"]], stored[TOKENS["loss_mask"]]))

    def _read(self, columns: list[str]) -> pa.Table:
        try:
            return pq.read_table(self.path, columns=columns)
        except (OSError, pa.ArrowException) as e:  # e.g. "Parquet magic bytes not found"
            raise DatasetFormatError(f"{self.path}: unreadable ({e}): the file is damaged; "
                                     f"{REDO}") from None

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.packed is not None:
            start, n = self.offsets[i], self.lengths[i]
            return (self.packed[0][start:start + n].long(),
                    self.packed[1][start:start + n].bool())
        columns = self.columns  # one read: the dataset may drop them from another thread
        if columns is None:
            table = self._read(["input_ids", "loss_mask"])
            columns = self.columns = (table.column("input_ids").combine_chunks(),
                                      table.column("loss_mask").combine_chunks())
        ids = columns[0][i].values.to_numpy(zero_copy_only=False)
        mask = columns[1][i].values.to_numpy(zero_copy_only=False)
        return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)

    def sample(self, i: int) -> Sample:
        start, n = self.offsets[i], self.lengths[i]
        return Sample(self.sample_ids[i], *self.tokens(i),
                      {k: read_rows(t, self.scales.get(k), start, n)
                       for k, t in self.tensors.items()})


class ExtractedDataset:
    """Samples of one split ("train", "heldout" or "probe") of an extraction directory."""

    KEEP_DECODED = 8  # shards whose token columns stay decoded (the most recently read)

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
        self.index = [(s, i) for s, shard in enumerate(self.shards)
                      for i in range(len(shard.sample_ids))]
        self.decoded: OrderedDict[int, None] = OrderedDict()  # shards with columns, oldest first
        self.lock = threading.Lock()  # a prefetch thread and its consumer may read at once

    def __len__(self) -> int:
        return len(self.index)

    def lengths(self) -> list[int]:
        """Every sample's token count, in dataset order (read from the shards' index)."""
        return [self.shards[s].lengths[i] for s, i in self.index]

    def _shard(self, shard: int) -> _Shard:
        """The shard, its columns counted as read last; the least recently read past
        KEEP_DECODED drop theirs (a shard whose tokens are memory-mapped decodes none)."""
        if self.shards[shard].packed is not None:
            return self.shards[shard]
        with self.lock:
            self.decoded[shard] = None
            self.decoded.move_to_end(shard)
            while len(self.decoded) > self.KEEP_DECODED:
                self.shards[self.decoded.popitem(last=False)[0]].columns = None
        return self.shards[shard]

    def __getitem__(self, i: int) -> Sample:
        shard, row = self.index[i]
        return self._shard(shard).sample(row)

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample i's (input_ids, loss_mask) alone: no hidden state is read (an FP8 store's
        are not dequantized), what counting the vocabulary over every sample needs."""
        shard, row = self.index[i]
        return self._shard(shard).tokens(row)

    def draft_inputs(self, sample: Sample) -> torch.Tensor:
        """[T, n_slots * H]: the layout's draft-input slots concatenated in layout order."""
        return torch.cat([sample.slots[name] for name in self.layout.names], dim=-1)

    def verifier(self, sample: Sample) -> torch.Tensor:
        return sample.slots[self.layout.verifier.name]  # [T, H]
