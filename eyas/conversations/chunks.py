"""Prepare's unit of work and of resumption: a chunk of records tokenized into one part file.

The prepare stage reads its records in order and hands them out in chunks of CHUNK. Each chunk
is tokenized on its own (in this process, or by a pool of workers: `tokenize_stream`'s
`submit`) into `parts/<split>-<index>.parquet`, with a sidecar holding the chunk's key (a
digest of the settings and of every record's id and messages) and its counts. A run stopped
midway finds the finished parts by their keys and tokenizes only the rest; the parts are then
merged, in order, into the split's file, cut into row groups exactly as one pass writes them,
so the output's bytes do not depend on how the chunks fell or which ran where.
"""
from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Iterable, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from eyas.conversations.loss_mask import tokenize_conversation
from eyas.conversations.records import BadRecordError, InvalidRecord, describe, report_bad
from eyas.files import atomic_path, write_json
from eyas.fingerprint import digest

CHUNK = 2048  # records a part holds: the work a stopped run loses at most, per worker
PARTS_DIR = "parts"
WRITE_BATCH = 512  # rows per Parquet row group: bounded memory whatever the data size

SCHEMA = pa.schema([
    ("sample_id", pa.string()),
    ("input_ids", pa.list_(pa.int32())),   # [num_tokens]
    ("loss_mask", pa.list_(pa.int8())),    # [num_tokens], 1 = assistant token
    ("num_tokens", pa.int32()),
    ("num_loss_tokens", pa.int32()),
    ("truncated", pa.bool_()),
])
COUNTS = ("samples", "tokens", "loss_tokens", "truncated")


def chunk_key(items: list, settings: dict) -> str:
    """What a part was made from: the settings (tokenizer, template, max_length, ...) and each
    record's sample id and messages."""
    return digest(json.dumps([settings, [(sid, record.messages) for sid, record in items]],
                             sort_keys=True).encode())


def tokenize_part(items: list, tokenizer, max_length: int, on_bad_record: str, path: str | Path,
                  key: str) -> dict:
    """Tokenize `items` ((sample id, Record) pairs) into the part file `path`, then its sidecar
    (written last: its presence with `key` means the part is whole); returns the counts
    (samples kept, tokens, loss tokens, truncated, skipped by reason). Rows are written
    WRITE_BATCH at a time: a worker holds one batch's token lists, not a chunk's."""
    counts, skipped = dict.fromkeys(COUNTS, 0), Counter()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, pq.ParquetWriter(str(tmp), SCHEMA) as writer:
        columns = {name: [] for name in SCHEMA.names}
        for sample_id, record in items:
            try:
                ids, mask, truncated = tokenize_conversation(record.messages, tokenizer,
                                                             max_length)
            except InvalidRecord as e:
                report_bad(BadRecordError(describe(record.source, record.location), e.reason,
                                          str(e)), on_bad_record, skipped)
                continue
            for name, value in zip(SCHEMA.names, (sample_id, ids, mask, len(ids), sum(mask),
                                                  truncated)):
                columns[name].append(value)
            for name, value in zip(COUNTS, (1, len(ids), sum(mask), truncated)):
                counts[name] += int(value)
            if len(columns["sample_id"]) == WRITE_BATCH:
                writer.write_table(pa.table(columns, schema=SCHEMA))
                columns = {name: [] for name in SCHEMA.names}
        if columns["sample_id"]:
            writer.write_table(pa.table(columns, schema=SCHEMA))
    stats = {**counts, "skipped": dict(skipped)}
    write_json(_sidecar(path), {"key": key, "stats": stats})
    return stats


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def finished(path: Path, key: str) -> Optional[dict]:
    """A part's counts when it is whole and was made from `key`'s records; else None."""
    try:
        side = json.loads(_sidecar(path).read_text())
        if side.get("key") != key or pq.read_metadata(path).num_rows != side["stats"]["samples"]:
            return None
        return side["stats"]
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None


def in_process(tokenizer) -> Callable[..., Future]:
    """A submit that tokenizes each chunk here, at once (prepare_split's default)."""
    def submit(items, path, key, max_length, on_bad_record):
        done: Future = Future()
        try:
            done.set_result(tokenize_part(items, tokenizer, max_length, on_bad_record, path,
                                          key))
        except Exception as e:  # noqa: BLE001 - re-raised by result(), where it is awaited
            done.set_exception(e)
        return done
    return submit


class _Chunks:
    """The parts of one split in order, and how many samples they can still add."""

    def __init__(self, directory: Path, split: str, settings: dict, submit, width: int):
        self.directory, self.split, self.settings = directory, split, settings
        self.submit, self.width = submit, max(1, width)
        self.parts: list[tuple[Path, Future, int]] = []  # (path, its counts, its records)
        self.reused = 0
        # kept_at_most's sum, kept as it goes (it is asked once a record): the parts known
        # finished counted by what they kept, the others (`unsettled`) by their records
        self.settled, self.unsettled = 0, []

    def add(self, items: list) -> None:
        path = self.directory / f"{self.split}-{len(self.parts):05d}.parquet"
        key = chunk_key(items, self.settings)
        stats = finished(path, key)
        if stats is not None:
            done: Future = Future()
            done.set_result(stats)
            self.reused += 1
        else:
            while sum(not f.done() for _, f, _ in self.parts) >= self.width:
                next(f for _, f, _ in self.parts if not f.done()).result()
            done = self.submit(items, path, key)
        self.parts.append((path, done, len(items)))
        self.unsettled.append((done, len(items)))

    def kept_at_most(self) -> int:
        """Samples kept by the finished parts, plus every record of the unfinished ones."""
        still = []
        for done, n in self.unsettled:
            if done.done():
                self.settled += done.result()["samples"]
            else:
                still.append((done, n))
        self.unsettled = still
        return self.settled + sum(n for _, n in still)

    def kept(self) -> int:
        return sum(f.result()["samples"] for _, f, _ in self.parts)


def tokenize_stream(stream: Iterable, directory: Path, split: str, settings: dict, submit,
                    width: int = 1, max_samples: Optional[int] = None,
                    skipped: Optional[Counter] = None,
                    on_room: Optional[Callable[[Callable[[], Optional[int]]], None]] = None
                    ) -> tuple[list[Path], dict]:
    """Tokenize `stream` ((sample id, Record, problem or None) in order; a record with a
    problem is counted in `skipped` and left out) in chunks: `submit(items, path, key)` returns
    a Future of the part's counts; at most `width` parts are in flight. With `max_samples`,
    the first that many kept samples in stream order, as one pass keeps them: a chunk is cut
    where the records read could fill the cap, and reading goes on only as far as the parts'
    outcomes leave room (`on_room` is handed a function giving that room, for a rewrite
    upstream that must not produce records past it: eyas.conversations.regenerate).
    Returns (the part files in order, the counts summed, skipped included)."""
    skipped = Counter() if skipped is None else skipped
    chunks = _Chunks(directory, split, settings, submit, width)
    buffer: list = []

    def room() -> Optional[int]:
        if max_samples is None:
            return None
        return max_samples - chunks.kept_at_most() - len(buffer)

    if on_room is not None:
        on_room(room)
    for sample_id, record, problem in stream:
        if problem is not None:  # the rewrite's, not the user's record: always counted
            skipped[problem] += 1
            continue
        buffer.append((sample_id, record))
        if len(buffer) == CHUNK or (max_samples is not None and room() <= 0):
            chunks.add(buffer)
            buffer = []
            if max_samples is not None and room() <= 0 and chunks.kept() >= max_samples:
                break  # kept() waits for every part: only then is the cap known to be met
    if buffer:
        chunks.add(buffer)
    totals = dict.fromkeys(COUNTS, 0)
    for _, done, _ in chunks.parts:
        stats = done.result()
        for name in COUNTS:
            totals[name] += stats[name]
        skipped.update(stats["skipped"])
    return [p for p, _, _ in chunks.parts], {**totals, "skipped": dict(sorted(skipped.items())),
                                             "parts_reused": chunks.reused}


def merge(parts: list[Path], out_path: Path, schema: pa.Schema) -> None:
    """The parts' rows, in order, into `out_path` (atomically), cut into row groups of
    WRITE_BATCH as one pass writes them."""
    with atomic_path(out_path) as tmp:
        with pq.ParquetWriter(str(tmp), schema) as writer:
            pending: list[pa.Table] = []
            rows = 0
            for part in parts:
                table = pq.read_table(part, schema=SCHEMA)
                pending.append(table)
                rows += table.num_rows
                while rows >= WRITE_BATCH:
                    joined = pa.concat_tables(pending)
                    writer.write_table(joined.slice(0, WRITE_BATCH).combine_chunks()
                                       .replace_schema_metadata(None))
                    rest = joined.slice(WRITE_BATCH)
                    pending, rows = [rest], rest.num_rows
            if rows:
                writer.write_table(pa.concat_tables(pending).combine_chunks()
                                   .replace_schema_metadata(None))


def remove_parts(parts: list[Path]) -> None:
    for part in parts:
        part.unlink(missing_ok=True)
        _sidecar(part).unlink(missing_ok=True)
