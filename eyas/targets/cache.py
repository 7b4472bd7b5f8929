"""Targets eyas makes itself (the built-in Llama it trains, SmolLM2 converted from its wheel),
cached under a key of everything that shapes them, so every stage and worker that asks gets
the same directory.

A build is written to a temp directory and renamed into place only when complete; concurrent
builders of one key serialize on a lock file, and the later ones find the finished cache. The
build report (REPORT_NAME) records each file's size and sha256; a cached build is checked
against them each time it is reused (`damage`), and a damaged one is said in one line and
rebuilt: the new build is complete before the damaged copy is moved aside and removed.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from eyas.files import sha256_file

log = logging.getLogger(__name__)

REPORT_NAME = "eyas_build.json"


def file_record(directory: Path) -> dict[str, dict]:
    """Each file of a build (but the report): its size and sha256, for `damage`."""
    return {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(directory.iterdir()) if p.is_file() and p.name != REPORT_NAME}


def read_report(path: Path) -> dict:
    return json.loads((Path(path) / REPORT_NAME).read_text())


def damage(path: Path) -> str | None:
    """What is wrong with the target cached at `path`, in words naming the file and the check,
    or None when it is intact: each file its report records against the size and sha256
    recorded at build time; a build from before that record, by its safetensors envelopes
    (header intact, tensor data ending where the file ends)."""
    from eyas.store.format import safetensors_problem

    path = Path(path)
    try:
        files = read_report(path).get("files")
    except (OSError, ValueError, AttributeError) as e:
        return f"{REPORT_NAME}: unreadable ({type(e).__name__}: {e})"
    if files is None:
        for f in sorted(path.glob("*.safetensors")):
            problem = safetensors_problem(f)
            if problem:
                return f"{f.name}: {problem} (safetensors header check)"
        return None
    for name, want in sorted(files.items()):
        f = path / name
        if not f.is_file():
            return f"{name}: missing (its build wrote it)"
        size = f.stat().st_size
        if size != want["bytes"]:
            return f"{name}: {size} bytes, its build wrote {want['bytes']} (size check)"
        if sha256_file(f) != want["sha256"]:
            return f"{name}: its sha256 is not the one recorded at build time (checksum check)"
    return None


def cached_build(cache_dir: str, name: str, build: Callable[[Path], dict], what: str
                 ) -> tuple[Path, dict, bool]:
    """(directory, report, whether it came from the cache) of the build `name` under
    `cache_dir`: the cached one when intact, else `build(tmp_dir)` (which writes the files and
    returns the report, to which the files' record is added). `what` names it in messages."""
    cache = Path(os.path.expanduser(cache_dir))
    final = cache / name
    if (final / REPORT_NAME).is_file():
        problem = damage(final)
        if problem is None:
            return final, read_report(final), True
        log.warning("eyas: the cached %s %s is damaged (%s): rebuilding it", what, final, problem)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open(cache / f"{name}.lock", "w")
    except OSError as e:
        raise OSError(f"cannot write the target cache directory {str(cache)!r} "
                      f"({e.strerror or e}); set target.builtin.cache_dir to a writable "
                      "directory") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also on a crash
        if (final / REPORT_NAME).is_file() and damage(final) is None:
            return final, read_report(final), True  # another builder's
        for stale in [*cache.glob(f".{name}.tmp-*"),  # left by a killed builder
                      *cache.glob(f".{name}.damaged-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
        try:
            report = {**build(tmp)}
            report["files"] = file_record(tmp)  # what `damage` checks a reuse against
            (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the cache from others
            for f in tmp.iterdir():  # as would a writer's 0600
                os.chmod(f, 0o666 & ~umask)
            aside = None
            if final.exists():  # damaged, or a report-less leftover; ours is complete
                aside = cache / f".{name}.damaged-{os.getpid()}"
                shutil.rmtree(aside, ignore_errors=True)
                os.rename(final, aside)
            os.rename(tmp, final)
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final, report, False
