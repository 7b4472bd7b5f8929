"""Files eyas writes so that nothing half-done is ever visible, and reads with errors that name
them. Every atomic write goes through `atomic_path`: the content lands under a temporary name
(`.tmp-PID-NAME`, which readers never look at and a re-run removes) and is renamed into place
only when complete.

No fsync: a file cut short by a crash is caught by its size or checksum when it is next used.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Iterable, Iterator

TMP_PREFIX = ".tmp-"
# the disk, not the data: a full or read-only file system (workflows/errors.py explains them)
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary name beside `path` to write to; renamed to `path` when the block ends
    without an error, removed when it raises."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{os.getpid()}-{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:  # a write that stops on the disk names the file it was writing
        if e.errno in DISK_ERRNOS and e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike, data: bytes | str | Iterable[bytes]) -> str:
    """Write bytes (a str as UTF-8, or an iterable of byte chunks) atomically; their sha256."""
    if isinstance(data, str):
        data = data.encode()
    h = hashlib.sha256()
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        for chunk in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
            h.update(chunk)
            f.write(chunk)
    return h.hexdigest()


def write_json(path: str | os.PathLike, obj, indent: int = 1, sort_keys: bool = False) -> str:
    return atomic_write(path, json.dumps(obj, indent=indent, sort_keys=sort_keys,
                                         default=str) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def why_absent(path: str | os.PathLike) -> str:
    """Why `path` cannot be opened, in words: a symbolic link that loops or leads nowhere is
    not a missing file, and saying so points at the fix."""
    import errno
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link that loops (it, or a link it leads to, points back)"
        if os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
        return "no such file or directory"
    return "not a file" if Path(path).is_dir() else "unreadable"


def read_model_config(directory: str | os.PathLike, what: str) -> dict:
    """`directory`/config.json of a model (`what`: "target", "draft"), named when missing."""
    file = Path(directory) / "config.json"
    if not file.is_file():
        why = why_absent(file)
        raise FileNotFoundError(f"{file}: no {what} config (is {directory} a {what} model "
                                "directory?)" if why == "no such file or directory" else
                                f"{file}: {why}; the {what}'s config.json cannot be read")
    return read_config_object(file, f"a {what} model config")


def read_config_object(file: str | os.PathLike, what: str = "a model config",
                       error: type[Exception] = ValueError) -> dict:
    """A JSON file that must hold an object: one that is not JSON, or holds something else, is
    refused as `error`, naming the file."""
    try:
        config = json.loads(Path(file).read_text())
    except ValueError as e:
        raise error(f"{file}: not JSON ({e})") from None
    if not isinstance(config, dict):
        raise error(f"{file}: a JSON {type(config).__name__}, not {what} (an object)")
    return config


FORMAT_KEY = "eyas_format"  # a versioned file's format version, its first key


class FormatVersionError(ValueError):
    """A file of eyas's in a format this eyas does not read (another version, or none)."""


RERUN = ("Rerun the stage that writes it into a new run directory (run_dir=...), or read it "
         "with the eyas that wrote it")


def check_format(data: dict, version: int, where, fix: str = RERUN) -> None:
    """Refuse `data` (read from `where`) unless it says it is in format `version`; `fix`: the
    way out, in words."""
    found = data.get(FORMAT_KEY) if isinstance(data, dict) else None
    if found != version:
        written = (f"{FORMAT_KEY} {found}" if found is not None else
                   f"no {FORMAT_KEY} (written by an eyas before its files were versioned)")
        raise FormatVersionError(
            f"{where}: {written}; this eyas reads {FORMAT_KEY} {version} only. {fix}")


class JsonReport:
    """A stage's report: one JSON file (`FILE`) in the stage's folder, written atomically by
    the stage and read back by the pipeline through the same type (the subclass, a dataclass,
    gives `to_dict` and `from_dict`). It carries its format's `VERSION`; one of another
    version is refused on reading, never read as a past shape."""

    FILE: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def write(self, out_dir: str | os.PathLike) -> Path:
        path = Path(out_dir) / self.FILE
        atomic_write(path, json.dumps({FORMAT_KEY: self.VERSION, **self.to_dict()}, indent=1,
                                      default=str))
        return path

    @classmethod
    def read(cls, out_dir: str | os.PathLike):
        path = Path(out_dir) / cls.FILE
        data = json.loads(path.read_text())
        check_format(data, cls.VERSION, path)
        try:
            return cls.from_dict({k: v for k, v in data.items() if k != FORMAT_KEY})
        except (KeyError, TypeError) as e:
            raise FormatVersionError(f"{path}: not a {cls.__name__} of {FORMAT_KEY} "
                                     f"{cls.VERSION} ({type(e).__name__}: {e}); was it edited "
                                     "by hand?") from None
