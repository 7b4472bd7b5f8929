"""The prepare stage: conversations -> token ids with the target's chat template + a loss mask
(eyas/conversations/loss_mask.py says which tokens it covers and how they are found).

Output per split: one Parquet file (sample_id, input_ids, loss_mask, num_tokens,
num_loss_tokens, truncated), the tokenizer and chat-template fingerprints in its schema
metadata; `prepare` adds manifest.json, with each file's size and checksum (`damaged_splits`
checks them). Later stages call `check_tokenizer_matches`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import logging
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from eyas.config import DataConfig, DemoDataConfig
from eyas.conversations import sharegpt
from eyas.conversations.chunks import (PARTS_DIR, SCHEMA, in_process, merge, remove_parts,
                                       tokenize_stream)
from eyas.conversations.records import (
    Record,
    check_on_bad_record,
    file_kind,
    iter_conversations,
    iter_records,
    record_locations,
)
from eyas.files import sha256_file, write_json
from eyas.fingerprint import chat_template_fingerprint, tokenizer_fingerprint
from eyas.progress import progress
from eyas.run_records import MANIFEST_FILE

logger = logging.getLogger(__name__)

FORMAT = "eyas.prepared/1"
META_PREFIX = "eyas."
HELDOUT_FRACTION = 0.05  # of train records, when no held-out files are given


class NoUsableSamples(ValueError):
    """A split with nothing left to train on; the message says what was skipped and why."""


class TokenizerMismatchError(ValueError):
    """Prepared data and the tokenizer at hand disagree (another tokenizer or template)."""


def _check_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} is not "
            "a fast (Rust `tokenizers`) tokenizer; eyas needs its offset mapping to place the "
            "loss mask: load it with AutoTokenizer.from_pretrained(..., use_fast=True) or add "
            "a tokenizer.json to the target directory")
    chat_template_fingerprint(tokenizer)  # raises a clear error when there is no template


def _source_labels(paths: Sequence[str]) -> dict[str, str]:
    """File stem per path (for sample ids); the whole path where two stems collide."""
    stems = Counter(Path(p).stem for p in paths)
    return {p: Path(p).stem if stems[Path(p).stem] == 1 else str(p) for p in paths}


def _is_file_list(items) -> bool:
    return all(isinstance(x, (str, os.PathLike)) for x in items)


def prepare_split(files_or_conversations: Sequence[Any], tokenizer, max_length: int,
                  on_bad_record: str, out_path: str | os.PathLike, split_name: str, *,
                  select: Optional[Callable[[str], bool]] = None, id_prefix: str = "demo",
                  show_progress: Optional[bool] = None,
                  rewrite: Optional[Callable[[Iterator], Iterator]] = None,
                  max_samples: Optional[int] = None, submit=None, width: int = 1,
                  keep_parts: bool = False) -> dict:
    """Tokenize one split into one Parquet file; returns its stats.

    files_or_conversations: conversation file paths (sample ids "<file stem>:<line or row>"),
      or in-memory messages lists (sample ids "<id_prefix>:<index>").
    select(sample_id): keep only the records it accepts (a held-out cut of a file set).
    rewrite: ((sample id, record) stream, need) -> (sample id, record, problem or None)
      stream, e.g. the target regenerating the assistant turns
      (eyas/conversations/regenerate.py); a record with a problem is left out and counted
      under it. need(): how many more samples max_samples leaves room for (None: no cap).
    max_samples: stop once this many are kept, the first in file order (so a larger cap keeps
      the same first ones); records past it are neither read nor regenerated.
    A file may be `builtin:sharegpt` (eyas.conversations.sharegpt): sample ids
      "sharegpt:<record id>", what reading it found in the stats' "sharegpt".
    Tokenized in chunks (eyas/conversations/chunks.py) into out_path's folder's parts/, then
    merged: `submit(items, part path, key, max_length, on_bad_record)` -> Future of the part's
    counts tokenizes a chunk elsewhere (default: here), `width` at a time; a stopped run's
    finished parts are reused.
    keep_parts: leave the parts for the caller to remove (the whole stage's resume).
    """
    check_on_bad_record(on_bad_record)
    if max_length < 1:
        raise ValueError(f"data.max_length={max_length}: must be at least 1")
    _check_tokenizer(tokenizer)
    if isinstance(files_or_conversations, (str, os.PathLike)):  # one file, not its characters
        files_or_conversations = [files_or_conversations]
    items = list(files_or_conversations)
    skipped: Counter = Counter()
    if _is_file_list(items):
        files = [str(p) for p in items]
        for path in files:  # a missing file or unknown type fails now, not hours in
            sharegpt.packaged_file() if path == sharegpt.SOURCE else file_kind(path)
        labels = _source_labels(files)
        read = sharegpt.ReadCounts() if sharegpt.SOURCE in files else None

        def records():
            for path in files:
                if path == sharegpt.SOURCE:
                    for index, sample_id, messages in sharegpt.conversations(read):
                        if select is None or select(sample_id):
                            yield sample_id, Record(path, index, messages)
                    continue
                keep = None if select is None else (
                    lambda loc, label=labels[path]: select(f"{label}:{loc}"))
                for record in iter_records(path, on_bad_record, skipped, keep):
                    yield f"{labels[path]}:{record.location}", record
    else:
        files, read = [], None

        def records():
            for record in iter_conversations(items, f"{split_name} conversations",
                                             on_bad_record, skipped):
                sample_id = f"{id_prefix}:{record.location}"
                if select is None or select(sample_id):
                    yield sample_id, record

    metadata = {
        b"eyas.format": FORMAT.encode(),
        b"eyas.split": split_name.encode(),
        b"eyas.tokenizer_fingerprint": tokenizer_fingerprint(tokenizer).encode(),
        b"eyas.chat_template_fingerprint": chat_template_fingerprint(tokenizer).encode(),
        b"eyas.max_length": str(max_length).encode(),
    }
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    stats = {"split": split_name, "path": out_path.name, "samples": 0, "tokens": 0,
             "loss_tokens": 0, "truncated": 0}
    settings = {"tokenizer": metadata[b"eyas.tokenizer_fingerprint"].decode(),
                "chat_template": metadata[b"eyas.chat_template_fingerprint"].decode(),
                "max_length": max_length, "on_bad_record": on_bad_record}
    room: dict[str, Callable[[], Optional[int]]] = {}
    need = None if max_samples is None else (lambda: room["left"]())
    stream = (rewrite(records(), need) if rewrite is not None else
              ((sample_id, record, None) for sample_id, record in records()))
    stream = progress(stream, desc=f"prepare {split_name}", unit=" records",
                      total=None if files else len(items),
                      disable=None if show_progress is None else not show_progress)
    run = submit or in_process(tokenizer)  # this split's max_length and on_bad_record: the
    # demo set's are not the config's (its windows too long are skipped, whatever it says)
    parts, counts = tokenize_stream(
        stream, out_path.parent / PARTS_DIR, split_name, settings,
        lambda items, path, key: run(items, path, key, max_length, on_bad_record), width,
        max_samples, skipped, on_room=lambda left: room.__setitem__("left", left))
    stats.update({k: counts[k] for k in ("samples", "tokens", "loss_tokens", "truncated")})
    if counts["parts_reused"]:
        logger.info("prepare %s: %d finished part(s) of a stopped run reused", split_name,
                    counts["parts_reused"])
    stats["skipped"] = dict(sorted(skipped.items()))
    if read is not None:
        stats["sharegpt"] = read.to_dict()
    if stats["samples"] == 0:
        regenerated = any(k.startswith("regenerated_") for k in skipped)
        raise NoUsableSamples(
            f"split {split_name!r}: no usable samples (skipped by reason: "
            f"{stats['skipped'] or 'none'}); "
            + ("the target's regenerated answers were empty (whitespace only) or cut off "
               "by data.generation.max_new_tokens: raise it, sample with "
               "data.generation.temperature>0, keep cut-off answers with "
               "data.generation.on_truncated=keep, or set data.regenerate=false"
               if regenerated else "check the input files"
               + (" or set data.heldout_files" if select is not None else "")))
    merge(parts, out_path, SCHEMA.with_metadata(metadata))
    if not keep_parts:
        remove_parts(parts)
    stats["bytes"], stats["sha256"] = out_path.stat().st_size, sha256_file(out_path)
    logger.info("prepared %s: %d samples, %d tokens (%d in the loss), %d truncated, skipped %s",
                split_name, stats["samples"], stats["tokens"], stats["loss_tokens"],
                stats["truncated"], stats["skipped"])
    return stats


def heldout_selection(files: Sequence[str]) -> Callable[[str], bool]:
    """Whether a sample id of `files` is held out: ShareGPT's by a hash of its record id
    (eyas.conversations.sharegpt.is_heldout), a file's records by `heldout_sample_ids`."""
    paths = [str(f) for f in files if str(f) != sharegpt.SOURCE]
    held = heldout_sample_ids(paths, HELDOUT_FRACTION) if paths else set()
    return lambda sample_id: (sharegpt.is_heldout(sample_id, HELDOUT_FRACTION)
                              if sample_id.startswith(sharegpt.PREFIX) else sample_id in held)


def heldout_sample_ids(files: Sequence[str], fraction: float = HELDOUT_FRACTION) -> set[str]:
    """A deterministic ~`fraction` of the records of `files` (at least one), by a hash of
    their sample ids, so the cut is the same on every machine and independent of file order."""
    labels = _source_labels([str(p) for p in files])
    ids = [f"{labels[str(p)]}:{loc}" for p in files for loc in record_locations(p)]
    if len(ids) < 2:
        raise ValueError(f"{list(map(str, files))}: {len(ids)} record(s); at least 2 are needed "
                         "to hold some out for evaluation; set data.heldout_files")
    k = max(1, round(fraction * len(ids)))
    return set(heapq.nsmallest(k, ids, key=lambda s: hashlib.sha256(s.encode()).digest()))


def demo_source_split(sources: Sequence, demo_cfg: DemoDataConfig) -> tuple[list, list]:
    """Source files for demo train and held-out conversations: disjoint, by a seeded hash of
    each file's path, in proportion to num_train : num_heldout (at least one file each)."""
    if len(sources) < 2:
        raise ValueError(f"the demo set needs at least 2 source files, got {len(sources)}")
    ranked = sorted(sources, key=lambda f: hashlib.sha256(
        f"{demo_cfg.seed}:{f.relpath}".encode()).digest())
    share = demo_cfg.num_heldout / max(1, demo_cfg.num_train + demo_cfg.num_heldout)
    n_heldout = min(len(sources) - 1, max(1, round(share * len(sources))))
    by_path = lambda f: f.relpath  # noqa: E731 - listing order, independent of the hash
    return sorted(ranked[n_heldout:], key=by_path), sorted(ranked[:n_heldout], key=by_path)


def demo_files(demo_cfg: DemoDataConfig) -> tuple:
    """The standard-library files a demo set is cut from: for code continuations those the
    built-in target never trained on; for docstring requests (a pretrained target's demo,
    which needs more functions than those files document) every file."""
    from eyas.targets.corpus import stdlib_sources

    split = stdlib_sources()
    return split.train + split.heldout if demo_cfg.source == "docstrings" else split.heldout


def demo_conversations(demo_cfg: DemoDataConfig, sources: Optional[Sequence] = None
                       ) -> tuple[list[list[dict]], list[list[dict]]]:
    """(train, heldout) demo conversations (demo_cfg.source: "continue this code", or requests
    from docstrings) from standard-library files (`sources`, default `demo_files(demo_cfg)`);
    no file contributes to both."""
    from eyas.targets.builtin import continuation_conversations

    sources = demo_files(demo_cfg) if sources is None else sources
    train_files, heldout_files = demo_source_split(sources, demo_cfg)

    def make(files, n):
        if demo_cfg.source == "docstrings":
            from eyas.conversations.docstrings import docstring_conversations
            return docstring_conversations(files, n, demo_cfg.seed,
                                           demo_cfg.multi_turn_fraction)
        return continuation_conversations(
            files, n, prompt_lines=demo_cfg.prompt_lines,
            completion_lines=demo_cfg.completion_lines, seed=demo_cfg.seed,
            multi_turn_fraction=demo_cfg.multi_turn_fraction)

    return make(train_files, demo_cfg.num_train), make(heldout_files, demo_cfg.num_heldout)


def prepare(data_cfg: DataConfig, tokenizer, out_dir: str | os.PathLike, *,
            demo_sources: Optional[Sequence] = None,
            show_progress: Optional[bool] = None, complete=None,
            target_fingerprint: str = "", engine: str = "", submit=None,
            width: int = 1) -> dict:
    """out_dir/train.parquet, out_dir/heldout.parquet and out_dir/manifest.json; returns the
    manifest. demo_sources: the files the demo set is cut from (default: the standard-library
    files held out from the built-in target). With data.regenerate, `complete` samples from
    the target (eyas.conversations.regenerate.Complete; `engine` names it in the manifest) and every
    assistant turn is the target's own, cached under out_dir/regenerated/ chunk by chunk.
    Tokenized chunk by chunk into out_dir/parts/ (`submit`, `width`: prepare_split's), which a
    stopped run resumes from and a finished one removes."""
    check_on_bad_record(data_cfg.on_bad_record)
    _check_tokenizer(tokenizer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    common = dict(tokenizer=tokenizer, max_length=data_cfg.max_length,
                  on_bad_record=data_cfg.on_bad_record, show_progress=show_progress)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "chat_template_fingerprint": chat_template_fingerprint(tokenizer),
        "max_length": data_cfg.max_length,
        "on_bad_record": data_cfg.on_bad_record,
        "train_files": list(map(str, data_cfg.train_files)),
        "heldout_files": list(map(str, data_cfg.heldout_files)),
        "heldout_from_train_fraction": None,
        "demo": None,
    }
    if not data_cfg.train_files:
        if data_cfg.heldout_files:
            raise ValueError("data.heldout_files is set but data.train_files is empty: give "
                             "train files too, or neither for the built-in demo set")
        if demo_sources is None:
            demo_sources = demo_files(data_cfg.demo)
        train_convs, heldout_convs = demo_conversations(data_cfg.demo, demo_sources)
        train_src, heldout_src = demo_source_split(demo_sources, data_cfg.demo)
        manifest["demo"] = {**dataclasses.asdict(data_cfg.demo),
                            "train_sources": [f.relpath for f in train_src],
                            "heldout_sources": [f.relpath for f in heldout_src]}
        # The demo set is ours, not the user's: a window too long for max_length is skipped
        # and counted (in the manifest) rather than failing the run.
        common["on_bad_record"] = manifest["on_bad_record"] = "skip"
        train = dict(files_or_conversations=train_convs, id_prefix="demo-train")
        heldout = dict(files_or_conversations=heldout_convs, id_prefix="demo-heldout")
    elif data_cfg.heldout_files:
        train = dict(files_or_conversations=data_cfg.train_files)
        heldout = dict(files_or_conversations=data_cfg.heldout_files)
    else:
        held = heldout_selection(data_cfg.train_files)
        manifest["heldout_from_train_fraction"] = HELDOUT_FRACTION
        train = dict(files_or_conversations=data_cfg.train_files,
                     select=lambda sample_id: not held(sample_id))
        heldout = dict(files_or_conversations=data_cfg.train_files, select=held)
    train["max_samples"], heldout["max_samples"] = data_cfg.max_train, data_cfg.max_heldout
    regeneration = None
    if data_cfg.regenerate:
        from eyas.conversations.regenerate import Regeneration
        from eyas.conversations.regenerate import CACHE_DIR
        regeneration = Regeneration(data_cfg, tokenizer, complete, target_fingerprint, engine,
                                    out_dir / CACHE_DIR)
    manifest["splits"] = {
        name: prepare_split(out_path=out_dir / f"{name}.parquet", split_name=name,
                            rewrite=regeneration and regeneration.rewrite(name),
                            submit=submit, width=width, keep_parts=True, **common, **split)
        for name, split in (("train", train), ("heldout", heldout))}
    manifest["regenerated"] = regeneration and regeneration.manifest()
    write_json(out_dir / MANIFEST_FILE, manifest, indent=2, sort_keys=True)  # last: its presence means done
    shutil.rmtree(out_dir / PARTS_DIR, ignore_errors=True)  # the splits hold it all now
    return manifest


REDO = "re-run the pipeline: the prepare stage is redone"


def damaged_splits(out_dir: str | os.PathLike,
                   checksum: Callable[[Path], bool] = lambda path: True) -> dict[str, str]:
    """file name -> what is wrong with it, for each split file manifest.json lists; {} if all
    are intact. Every file's size, Parquet magic and footer (its row count) are checked; the
    full checksum where `checksum(path)` says so."""
    try:
        splits = json.loads((Path(out_dir) / MANIFEST_FILE).read_text())["splits"]
    except (OSError, ValueError, KeyError) as e:
        return {MANIFEST_FILE: f"unreadable: {e}"}
    found = {}
    for stats in splits.values():
        path = Path(out_dir) / stats["path"]
        problem = _split_problem(path, stats)
        if problem is None and stats.get("sha256") and checksum(path) \
                and sha256_file(path) != stats["sha256"]:
            problem = "its checksum differs from the one recorded when it was written"
        if problem:
            found[path.name] = problem
    return found


def _split_problem(path: Path, stats: dict) -> str | None:
    if not path.exists():
        return "missing"
    if stats.get("bytes") is not None and path.stat().st_size != stats["bytes"]:
        return f"{path.stat().st_size} bytes, {stats['bytes']} when written"
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PAR1":
                return "no Parquet magic bytes at its start"
        rows = pq.read_metadata(path).num_rows
    except (OSError, pa.ArrowException) as e:
        return f"unreadable: {e}"
    return None if rows == stats["samples"] else f"{rows} rows, {stats['samples']} when written"


def check_tokenizer_matches(metadata: dict, tokenizer) -> None:
    """Refuse prepared data (split metadata or manifest) made with another tokenizer/template."""
    expected = {"tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
                "chat_template_fingerprint": chat_template_fingerprint(tokenizer)}
    missing = [key for key in expected if key not in metadata]
    if missing:
        raise ValueError(f"prepared-data metadata lacks {missing}: was it written by eyas' "
                         "prepare stage?")
    wrong = [f"{key.removesuffix('_fingerprint').replace('_', ' ')}: data has "
             f"{metadata[key]}, target has {value}"
             for key, value in expected.items() if metadata[key] != value]
    if wrong:
        raise TokenizerMismatchError(
            "the data was prepared with another tokenizer or chat template than this "
            f"target's ({'; '.join(wrong)}); re-run the prepare stage with this target")
