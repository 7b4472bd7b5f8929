"""Reading extracted hidden states: memory-mapped, random access by sample, checked at the door.

The reader is where a dataset meets its consumer (trainer, evaluator, doctor). It checks the
format, each file's presence, size and envelope (`verify="sizes"`, the default: it reads heads
and tails, never the data, so an open costs the same at any size), or every file's checksum
on demand (`verify="full"`: a stage that resumes has the pipeline check them, caching what it
verified); and, when the caller says what it expects, the layout and the target: a mismatch is
an error naming both sides. A damaged file is an error naming the file and the fix, never a
bare pyarrow or JSON error.

Token ids and loss masks stay in the shards' Arrow columns (about 9 bytes a token), not
Python lists (about 50): a trainer's memory for them is a fifth of what it was.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyas.store.format import (FORMAT, REDO, DatasetFormatError, dequantize, file_problem,
                               read_rows, read_safetensors_mmap)
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
    def __init__(self, directory: Path, name: str):
        path = directory / f"{name}.parquet"
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as e:  # e.g. "Parquet magic bytes not found"
            raise DatasetFormatError(f"{path}: unreadable ({e}): the file is damaged; "
                                     f"{REDO}") from None
        self.sample_ids = table.column("sample_id").to_pylist()
        # [samples] lists of tokens, as Arrow holds them (one buffer each, no Python objects)
        self.input_ids = table.column("input_ids").combine_chunks()
        self.loss_mask = table.column("loss_mask").combine_chunks()
        self.offsets = table.column("offset").to_pylist()
        self.lengths = table.column("length").to_pylist()
        with warnings.catch_warnings():  # read-only mmap: tensors are views, never written
            warnings.simplefilter("ignore", UserWarning)
            stored, _ = read_safetensors_mmap(directory / f"{name}.safetensors")
        self.tensors, self.scales = dequantize(stored)

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.input_ids[i].values.to_numpy(zero_copy_only=False)
        mask = self.loss_mask[i].values.to_numpy(zero_copy_only=False)
        return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)

    def sample(self, i: int) -> Sample:
        start, n = self.offsets[i], self.lengths[i]
        return Sample(self.sample_ids[i], *self.tokens(i),
                      {k: read_rows(t, self.scales.get(k), start, n)
                       for k, t in self.tensors.items()})


class ExtractedDataset:
    """Samples of one split ("train", "heldout" or "probe") of an extraction directory."""

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

    def __len__(self) -> int:
        return len(self.index)

    def lengths(self) -> list[int]:
        """Every sample's token count, in dataset order (read from the shards' index)."""
        return [self.shards[s].lengths[i] for s, i in self.index]

    def __getitem__(self, i: int) -> Sample:
        shard, row = self.index[i]
        return self.shards[shard].sample(row)

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample i's (input_ids, loss_mask) alone: no hidden state is read (an FP8 store's
        are not dequantized), what counting the vocabulary over every sample needs."""
        shard, row = self.index[i]
        return self.shards[shard].tokens(row)

    def draft_inputs(self, sample: Sample) -> torch.Tensor:
        """[T, n_slots * H]: the layout's draft-input slots concatenated in layout order."""
        return torch.cat([sample.slots[name] for name in self.layout.names], dim=-1)

    def verifier(self, sample: Sample) -> torch.Tensor:
        return sample.slots[self.layout.verifier.name]  # [T, H]
