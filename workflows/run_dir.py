"""The run directory: one writer at a time, finished work never deleted first, damage found.

    run_dir/
      .eyas.lock        flock'ed by the run writing here; its text names the holder
      config.yaml, mlflow.db, mlartifacts/      written only under the lock
      mlflow_unlogged.jsonl                     MLflow calls the store did not take (tracking.py)
      <stage>/          _STARTED.json: the key of the attempt under way or done
                        _COMPLETE.json: the key and output fingerprint of the finished stage
                        _CHECKED.json: size and mtime of each file when last verified
      <stage>.previous/ the last finished output of a stage whose key then changed

One writer. `RunDirLock` takes an exclusive flock on `.eyas.lock` before anything else is
written, and holds it for the whole run: a second run is refused (`RunDirBusy`, a config error,
exit 2) naming the holder's pid, host and start time. The kernel releases a flock when its
process dies, so a crashed run never blocks the next one; the file is never removed (removing
it would let two runs lock two different files). Across hosts this needs a file system whose
locks are shared between clients (NFSv4 is).

Finished work is never deleted first. When a stage's key changed, `begin` moves its finished
output to `<stage>.previous` (replacing an older one) before the new attempt starts; `finish`
removes it once the new output is complete, so the disk holds one extra copy of a stage only
while it is being redone. Until then, a run with the earlier config gets it back instead of
redoing it (`restore`). Unfinished work of another key is removed; unfinished work of the same
key is kept, and the stage resumes from it.

Damage. A stage is up to date when its marker's key matches and its output fingerprint (a
digest of the files in `Stage.outputs`) still holds. Prepare's splits and extract's shards are
more than that: `damage` checks every file their manifest lists, on every re-run, for its size
and envelope (Parquet magic bytes and footer with the row count, safetensors header and data
extent: a few bytes each), and its checksum when the file's size or mtime differs from the
last verification. A full checksum of terabytes of shards on every re-run would take hours to
find nothing; whatever rewrites or truncates a file changes its mtime, and damage that does
not (bit rot, a write that restores the mtime) is still caught where the data is read: the
reader verifies every checksum when it opens an extraction. A damaged stage is redone under
the same key: extract resumes, redoing only the shards whose checksums fail; prepare, cheap
next to extraction, is redone whole and writes the same bytes, so later stages stay done.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Callable

from eyas.files import write_json
from workflows.config import ConfigError

LOCK = ".eyas.lock"
MARKER = "_COMPLETE.json"
STARTED = "_STARTED.json"
CHECKED = "_CHECKED.json"


class RunDirBusy(ConfigError):
    """Another run holds the run directory."""


class RunDirLock:
    """Exclusive use of a run directory for the life of one pipeline run."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self.handle = None

    def __enter__(self) -> "RunDirLock":
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+")  # never truncated before it is ours
        except OSError as e:
            raise ConfigError(f"run_dir={self.run_dir}: cannot create {self.path} "
                              f"({e.strerror}); choose a writable run_dir") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process that is starting up"
            handle.close()
            raise RunDirBusy(
                f"run_dir={self.run_dir} is in use by another eyas run: {holder} (it holds "
                f"{self.path}). Wait for that run to finish, or give this one another "
                "run_dir=...; one directory takes one run at a time.") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, started "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self.handle = handle
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()  # releases the flock


def read_json(path: Path) -> dict | None:
    """A marker's content; None if it is missing or unreadable (a damaged marker means the
    stage is not known to be finished)."""
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def previous_dir(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / f"{name}.previous"


def restore(run_dir: Path, name: str, key: str) -> bool:
    """Bring back the kept finished output made under `key`, when the stage's directory holds
    no finished output (a change whose new attempt failed, then a run with the earlier config).
    The unfinished attempt it replaces is removed."""
    kept, current = previous_dir(run_dir, name), Path(run_dir) / name
    if (read_json(kept / MARKER) or {}).get("key") != key or (current / MARKER).exists():
        return False
    if current.exists():
        shutil.rmtree(current)
    kept.rename(current)
    return True


def _carried() -> dict[str, tuple[str, ...]]:
    """Per stage, the caches that check themselves (each entry carries a fingerprint of its
    inputs, and one whose inputs differ is recomputed), so an attempt under another key keeps
    them: the target's regenerated answers, an hour of a 2-core machine for 640 chats."""
    from eyas.conversations.regenerate import CACHE_DIR
    return {"prepare": (CACHE_DIR,)}


def begin(run_dir: Path, name: str, key: str) -> None:
    """Make the stage's directory ready for an attempt under `key`: work of the same key stays
    (its marker removed, so the stage redoes what is missing or damaged), finished work of
    another key moves aside, unfinished work of another key is removed; either way the
    stage's self-checking caches (_carried) come along into the new attempt."""
    current = Path(run_dir) / name
    carried = [c for c in _carried().get(name, ()) if (current / c).is_dir()]
    if current.exists():
        own = read_json(current / STARTED) or read_json(current / MARKER) or {}
        if own.get("key") == key:
            (current / MARKER).unlink(missing_ok=True)
            carried = []
        elif (current / MARKER).exists():
            kept = previous_dir(run_dir, name)
            if kept.exists():
                shutil.rmtree(kept)
            current.rename(kept)
            current.mkdir(parents=True)
            for cache in carried:  # copied: the finished work stays whole until replaced
                shutil.copytree(kept / cache, current / cache)
        else:
            aside = Path(run_dir) / f".{name}.carried"
            shutil.rmtree(aside, ignore_errors=True)
            aside.mkdir()
            for cache in carried:
                (current / cache).rename(aside / cache)
            shutil.rmtree(current)
            aside.rename(current)
    current.mkdir(parents=True, exist_ok=True)
    (current / STARTED).write_text(json.dumps({"key": key}))


def finish(run_dir: Path, name: str) -> None:
    """After the stage's marker is written: its fresh files are the verified state (their
    checksums were computed as they were written or checked as they were reused), and the
    output it replaced is no longer needed."""
    damage(run_dir, name, fresh=True)
    kept = previous_dir(run_dir, name)
    if kept.exists():
        shutil.rmtree(kept)


def _checkers() -> dict[str, Callable[[Path, Callable[[Path], bool]], dict[str, str]]]:
    from eyas.conversations.prepare import damaged_splits
    from eyas.store.format import damaged_files

    return {"prepare": damaged_splits, "extract": damaged_files}


def damage(run_dir: Path, name: str, fresh: bool = False) -> dict[str, str]:
    """file name -> what is wrong with it, for a finished stage whose outputs go beyond its
    fingerprinted files; {} when intact. Checksums are verified for files whose size or mtime
    changed since their last verification (`fresh`: none; the files were just written)."""
    check = _checkers().get(name)
    if check is None:  # every output is in the output fingerprint: the marker check is enough
        return {}
    stage_dir = Path(run_dir) / name
    verified = {} if fresh else read_json(stage_dir / CHECKED) or {}
    seen: dict[str, list[int]] = {}

    def needs_checksum(path: Path) -> bool:
        st = path.stat()
        seen[path.name] = [st.st_size, st.st_mtime_ns]
        return not fresh and verified.get(path.name) != seen[path.name]

    try:
        found = check(stage_dir, needs_checksum)
    except ValueError as e:  # an unreadable manifest
        return {"manifest.json": str(e)}
    intact = {f: v for f, v in seen.items() if f not in found}
    if intact != verified:
        write_json(stage_dir / CHECKED, intact, indent=0, sort_keys=True)
    return found


def describe(found: dict[str, str], limit: int = 3000) -> str:
    """'file: problem; ...' cut to `limit` characters (an MLflow tag's room)."""
    text = "; ".join(f"{f}: {p}" for f, p in sorted(found.items()))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(found)} files in all)"
