"""Text every machine has: Python's own standard-library sources, split into train/held-out.

The split is by a hash of each file's relative path, so it is the same on every machine with
the same Python, whatever the file system's listing order.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Generated tables, vendored data and tests: repetitive text that would teach little.
_SKIP_PARTS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__",
               "lib2to3", "pydoc_data", "encodings", "unicodedata", "ensurepip", "turtledemo"}


@dataclass(frozen=True)
class SourceFile:
    relpath: str
    text: str


@dataclass(frozen=True)
class CorpusSplit:
    train: tuple[SourceFile, ...]
    heldout: tuple[SourceFile, ...]
    fingerprint: str  # changes with any file's path or content


def _is_heldout(relpath: str, fraction: float) -> bool:
    bucket = int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return bucket < fraction


def stdlib_sources(heldout_fraction: float = 0.05, max_mb: float = 24.0) -> CorpusSplit:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not _SKIP_PARTS.intersection(p.relative_to(root).parts))
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}: the built-in target needs "
                                "the standard library's .py files")
    budget, train, heldout = int(max_mb * 2**20), [], []
    h = hashlib.sha256()
    for p in files:
        text = p.read_text(encoding="utf-8", errors="replace")
        rel = p.relative_to(root).as_posix()
        if budget - len(text) < 0:
            break
        budget -= len(text)
        h.update(rel.encode() + b"\0" + text.encode() + b"\0")
        (heldout if _is_heldout(rel, heldout_fraction) else train).append(SourceFile(rel, text))
    return CorpusSplit(tuple(train), tuple(heldout), h.hexdigest()[:16])
