"""The stored dataset's on-disk format: what extraction writes and every stage reads.

    run_dir/extract/
      manifest.json                 layout (with per-slot norm fingerprints), target identity,
                                    dtype, every shard's counts and checksums
      shard-train-00000.parquet     sample_id, input_ids, loss_mask, offset, length per sample;
                                    the layout in the schema metadata
      shard-train-00000.safetensors one tensor per slot, token-packed: [tokens_in_shard, H]
      shard-train-00000.json        the shard's record, written LAST: its presence = complete
      probe.parquet / probe.safetensors   a few held-out samples with EVERY layer's output

Sample i of a shard owns rows offset[i] : offset[i] + length[i] of every slot tensor. Files are
written under a temporary name and renamed when complete (eyas/store/writer.py), so a killed
writer leaves only `.tmp-*` files, which readers never look at and a re-run removes; the
reader is eyas/store/reader.py.

A file damaged afterwards (cut short, bytes changed) is found by `damaged_files`: every listed
file's size and envelope (Parquet magic and footer with its row count, safetensors header and
data extent) cheaply, its checksum when the caller asks; every error names the file and the fix.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyas.files import sha256_file
from eyas.run_records import MANIFEST_FILE

FORMAT = "eyas.extract/1"
META_LAYOUT = b"eyas.layout"


# extract.dtype=float8_e4m3fn: each token's row of a slot is stored as float8 divided by its own
# scale (its largest magnitude / FP8_MAX), the scales beside it as `<slot>.scale` [tokens]
# float32: the rows' norms (2.8 for SmolLM2's embedding, 50-840 for its layers) survive, and
# every element keeps float8's 3 mantissa bits relative to its row's largest. Readers hand
# back bfloat16 (`dequantize`).
FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
SCALE_SUFFIX = ".scale"


def quantize(packed: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors a shard stores for token-packed `packed` ([tokens, H] per slot) in `dtype`:
    the same tensors cast, or for FP8 each slot's rows scaled to float8 and their scales."""
    if dtype != FP8:
        return {name: t.to(dtype) for name, t in packed.items()}
    out = {}
    for name, t in packed.items():
        rows = t.float()
        scale = (rows.abs().amax(dim=-1) / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
        out[name] = (rows / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        out[name + SCALE_SUFFIX] = scale
    return out


# each shard's token ids [tokens] int32 and loss mask [tokens] uint8, token-packed as the slots
# are, beside them in its safetensors: a reader memory-maps them, so an open store holds no
# token of its own (its Parquet holds them too, per sample; stores written before read those)
TOKENS = {"input_ids": "tokens.input_ids", "loss_mask": "tokens.loss_mask"}


def token_tensors(samples: list[dict]) -> dict[str, torch.Tensor]:
    """The shard's token tensors for `samples` ({input_ids, loss_mask} each), in order."""
    ids = [int(t) for s in samples for t in s["input_ids"]]
    mask = [int(m) for s in samples for m in s["loss_mask"]]
    return {TOKENS["input_ids"]: torch.tensor(ids, dtype=torch.int32),
            TOKENS["loss_mask"]: torch.tensor(mask, dtype=torch.uint8)}


def dequantize(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor],
                                                        dict[str, torch.Tensor]]:
    """(slot tensors, their scales) from a shard's stored tensors (its token tensors left
    out); `read_rows` gives a slot's rows back in a compute dtype."""
    tokens = set(TOKENS.values())
    scales = {n[:-len(SCALE_SUFFIX)]: t for n, t in tensors.items() if n.endswith(SCALE_SUFFIX)}
    return {n: t for n, t in tensors.items()
            if not n.endswith(SCALE_SUFFIX) and n not in tokens}, scales


def read_rows(tensor: torch.Tensor, scale: torch.Tensor | None, start: int, n: int
              ) -> torch.Tensor:
    """Rows start:start+n of a stored slot: a view of the file, or for FP8 its values times
    their scales in bfloat16."""
    rows = tensor[start:start + n]
    if scale is None:
        return rows
    return (rows.float() * scale[start:start + n, None]).to(torch.bfloat16)


# what to do about a damaged shard: a re-run finds it (checksums) and extracts it again
REDO = "re-run the pipeline: the damaged shard is redone"


class DatasetFormatError(ValueError):
    """A stored dataset that is missing, damaged or not what its reader expects."""


@dataclass
class NormSums:
    """Running sums of per-token L2 norms of one slot (mean/std come from these)."""

    count: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    def add(self, norms: torch.Tensor) -> None:
        norms = norms.double()
        self.count += norms.numel()
        self.total += norms.sum().item()
        self.total_sq += (norms * norms).sum().item()

    def merge(self, other: "NormSums") -> None:
        self.count += other.count
        self.total += other.total
        self.total_sq += other.total_sq

    @property
    def mean(self) -> float:
        return self.total / max(1, self.count)

    @property
    def std(self) -> float:
        return max(0.0, self.total_sq / max(1, self.count) - self.mean ** 2) ** 0.5


@dataclass
class ShardRecord:
    name: str
    split: str
    samples: int
    tokens: int
    files: dict[str, str]  # file name -> sha256
    bytes: int
    tensor_bytes: int  # raw bytes of the slot tensors alone
    norms: dict[str, NormSums] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # file name -> bytes

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ShardRecord":
        return cls(**{**d, "norms": {k: NormSums(**v) for k, v in d["norms"].items()}})


def listed_files(out_dir: Path) -> dict[str, dict]:
    """Every file manifest.json lists: name -> {"sha256", "size", "rows" (a Parquet file's
    sample count)}; a manifest of another format is refused."""
    path = Path(out_dir) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DatasetFormatError(f"{path}: unreadable ({e}); re-run the pipeline: the extract "
                                 "stage resumes and writes it again") from None
    if manifest.get("format") != FORMAT:
        raise DatasetFormatError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}: "
                                 "an extraction this eyas does not read; extract again into a "
                                 "new run directory")
    files = {}
    for record in manifest["shards"] + ([manifest["probe"]] if manifest.get("probe") else []):
        for fname, digest in record["files"].items():
            files[fname] = {"sha256": digest, "size": record["sizes"][fname],
                            "rows": record["samples"] if fname.endswith(".parquet") else None}
    return files


def damaged_files(out_dir: Path, checksum: Callable[[Path], bool] = lambda path: True
                  ) -> dict[str, str]:
    """file name -> what is wrong with it, for the files manifest.json lists; {} if intact.

    Size and envelope are checked for every file (a few bytes read each); the full checksum
    only where `checksum(path)` says so (it is a full read: terabytes for a large extraction).
    """
    found = {}
    for fname, want in listed_files(out_dir).items():
        path = Path(out_dir) / fname
        problem = file_problem(path, want["size"], want["rows"])
        if problem is None and checksum(path) and sha256_file(path) != want["sha256"]:
            problem = "its checksum differs from the one recorded when it was written"
        if problem:
            found[fname] = problem
    return found


def file_problem(path: Path, size: int | None, rows: int | None = None) -> str | None:
    """Why a written Parquet or safetensors file cannot be what was written, or None: missing,
    another size, or a broken envelope. Reads the head and the tail, never the data."""
    if not path.exists():
        return "missing"
    actual = path.stat().st_size
    if size is not None and actual != size:
        return f"{actual} bytes, {size} when written"
    try:
        if path.suffix == ".parquet":
            with open(path, "rb") as f:
                if f.read(4) != b"PAR1":
                    return "no Parquet magic bytes at its start"
            found = pq.read_metadata(path).num_rows
            if rows is not None and found != rows:
                return f"{found} rows, {rows} when written"
        elif path.suffix == ".safetensors":
            _safetensors_header(path)
    except (OSError, ValueError, pa.ArrowException) as e:
        return f"unreadable: {e}"
    return None


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """(header, header length) of a safetensors file; a damaged file (header cut or garbled,
    tensor data beyond the file's end) is an DatasetFormatError naming it and the fix."""
    try:
        return _safetensors_header(path)
    except ValueError as e:
        raise DatasetFormatError(f"{path}: {e}: the file is damaged; {REDO}") from None


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's envelope (header cut or garbled, tensor data
    beyond or short of the file's end), or None; no tensor is read."""
    try:
        _safetensors_header(path)
    except (OSError, ValueError) as e:
        return str(e)
    return None


def _safetensors_header(path: Path) -> tuple[dict, int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        if not 2 <= header_len <= size - 8:
            raise ValueError(f"a header of {header_len} bytes in a file of {size}")
        try:
            header = json.loads(f.read(header_len))
            end = max((info["data_offsets"][1] for key, info in header.items()
                       if key != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise ValueError(f"an unreadable header ({type(e).__name__}: {e})") from None
    if 8 + header_len + end != size:
        raise ValueError(f"{size} bytes, but its header places tensor data up to byte "
                         f"{8 + header_len + end}")
    return header, header_len


# madvise(2): a store read in random order, sample by sample (MADV_RANDOM: no read-around on a
# page fault), and the rows a sample reads asked for as it is read (MADV_WILLNEED). Left to the
# kernel's read-around, a fault on a store larger than memory reads the device's readahead
# window (`read_ahead_kb`, megabytes on a cloud disk) around each touched page, most of it
# never used: bench/store_read_bench.py measures the bytes read and the time, both ways.
MADV_RANDOM, MADV_WILLNEED = 1, 3
PAGE = 4096


def _madvise():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fn = libc.madvise
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return fn
    except (OSError, AttributeError, TypeError):
        return None


_MADVISE = _madvise()


def advise(address: int, length: int, advice: int) -> None:
    """madvise over [address, address + length) of a mapping, widened to its pages; a no-op
    where the C library has none (the advice changes speed, never what is read)."""
    if _MADVISE is None or length <= 0:
        return
    start = address - address % PAGE
    _MADVISE(start, address + length - start, advice)


def will_need(rows: torch.Tensor) -> torch.Tensor:
    """`rows` (a contiguous view of a memory-mapped file) asked of the disk now, in one
    request; returned as is."""
    advise(rows.data_ptr(), rows.numel() * rows.element_size(), MADV_WILLNEED)
    return rows


def read_safetensors_mmap(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Memory-map a safetensors file: tensors view the page cache, nothing is read up front;
    the mapping is read at random (see MADV_RANDOM above): a reader asks for its rows with
    `will_need`."""
    header, header_len = read_safetensors_header(path)
    metadata = header.pop("__metadata__", {})
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    if raw.size:
        advise(raw.ctypes.data, raw.size, MADV_RANDOM)
    tensors = {}
    for key, info in header.items():
        start, end = info["data_offsets"]
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        buf = torch.from_numpy(raw[start:end]) if end > start else torch.empty(0, dtype=torch.uint8)
        tensors[key] = buf.view(dtype).view(info["shape"])
    return tensors, metadata


SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool, "U8": torch.uint8,
              "F8_E4M3": torch.float8_e4m3fn}
SAFETENSORS_DTYPE_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}
