"""Reading conversation files: JSONL or Parquet, OpenAI `messages` or ShareGPT `conversations`.

Every record comes out as `Record(source, location, messages)` with `messages` normalized to
`[{"role": "system"|"user"|"assistant", "content": str}]`. A record that can't be trained on is
never dropped silently: it raises `BadRecordError` naming the file, the 1-based line (JSONL) or
row (Parquet), what is wrong and how to fix it, or, with `on_bad_record="skip"`, it is counted
by reason (and the first of each reason is logged).
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

logger = logging.getLogger(__name__)

ON_BAD_RECORD = ("error", "skip")
JSONL_SUFFIXES = (".jsonl",)
PARQUET_SUFFIXES = (".parquet", ".pq")

# OpenAI roles map to themselves; ShareGPT names (`from`) map to the OpenAI role they mean.
ROLE_ALIASES = {
    "system": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bot": "assistant",
}
# (list key, role key, content key) of each accepted style, in order of preference.
_STYLES = (("messages", "role", "content"), ("conversations", "from", "value"))


class InvalidRecord(ValueError):
    """What is wrong with one record, before the reader knows where it sits (file and line)."""

    def __init__(self, reason: str, problem: str):
        super().__init__(problem)
        self.reason = reason  # short key the skip counts are grouped by

    def __reduce__(self):  # picklable, so it crosses a Ray task boundary as itself
        return type(self), (self.reason, str(self))


class BadRecordError(ValueError):
    """A record that can't be trained on; the message names where it is and how to fix it."""

    def __init__(self, where: str, reason: str, problem: str):
        super().__init__(f"{where}: {problem} (set data.on_bad_record=skip to skip and count "
                         "such records instead)")
        self.where, self.reason, self.problem = where, reason, problem

    def __reduce__(self):  # picklable, so it crosses a Ray task boundary as itself
        return type(self), (self.where, self.reason, self.problem)


class Record(NamedTuple):
    source: str    # the file path as given, or a name for in-memory conversations
    location: int  # 1-based line (JSONL) or row (Parquet); 0-based index in memory
    messages: list[dict[str, str]]


def describe(source: str, location: int) -> str:
    """Where a record sits, for error messages: "f.jsonl line 3", "f.parquet row 3", "x[3]"."""
    name = source.lower()
    if name.endswith(JSONL_SUFFIXES):
        return f"{source} line {location}"
    if name.endswith(PARQUET_SUFFIXES):
        return f"{source} row {location}"
    return f"{source}[{location}]"


def check_on_bad_record(on_bad_record: str) -> None:
    if on_bad_record not in ON_BAD_RECORD:
        raise ValueError(f"data.on_bad_record={on_bad_record!r}: must be one of {ON_BAD_RECORD}")


def report_bad(error: BadRecordError, on_bad_record: str, skipped: Optional[Counter]) -> None:
    """Raise `error`, or count it under its reason when skipping (never a silent drop)."""
    if on_bad_record != "skip":
        raise error
    if skipped is None:
        raise ValueError("on_bad_record='skip' needs a Counter to count skipped records in")
    skipped[error.reason] += 1
    if skipped[error.reason] == 1:  # one line per reason: a million bad rows can't flood the log
        logger.warning("skipping %s; further %r records are counted, not logged",
                       error.where + ": " + error.problem, error.reason)


def normalize_messages(record: Any) -> list[dict[str, str]]:
    """Validate one decoded record; return its messages as OpenAI-style role/content dicts."""
    if not isinstance(record, dict):
        raise InvalidRecord("not_object", f"is a JSON {type(record).__name__}, not an object; "
                            'each record must be an object like {"messages": [...]}')
    for list_key, role_key, content_key in _STYLES:
        if record.get(list_key) is not None:
            break
    else:
        raise InvalidRecord("missing_messages", (
            "has neither `messages` (OpenAI style: [{role, content}]) nor `conversations` "
            f"(ShareGPT style: [{{from, value}}]); its keys are {sorted(record)}"))
    items = record[list_key]
    if not isinstance(items, list):
        raise InvalidRecord("missing_messages",
                            f"`{list_key}` is a {type(items).__name__}, not a list of turns")
    messages = []
    for j, item in enumerate(items):
        at = f"{list_key}[{j}]"
        if not isinstance(item, dict):
            raise InvalidRecord("missing_role_or_content",
                                f"{at} is a {type(item).__name__}, not a "
                                f"{{{role_key}, {content_key}}} object")
        for key in (role_key, content_key):
            if key not in item:
                raise InvalidRecord("missing_role_or_content", (
                    f"{at} has no `{key}` field (keys: {sorted(item)}); {list_key} turns need "
                    f"`{role_key}` and `{content_key}`"))
        role = item[role_key]
        if not isinstance(role, str) or role.lower() not in ROLE_ALIASES:
            raise InvalidRecord("unknown_role", (
                f"{at} has {role_key} {role!r}; known: {sorted(ROLE_ALIASES)} (map tool or "
                "function turns to one of these, or drop them)"))
        content = item[content_key]
        if not isinstance(content, str):
            raise InvalidRecord("content_not_string", (
                f"{at}.{content_key} is {'null' if content is None else type(content).__name__}, "
                "not a string (multi-part or tool-call content is not supported: flatten it "
                "to text)"))
        messages.append({"role": ROLE_ALIASES[role.lower()], "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise InvalidRecord("no_assistant_turn", "has no assistant turn, so nothing to train "
                            "on; add the assistant's reply or drop the record")
    return messages


def file_kind(path: str | os.PathLike) -> str:
    """'jsonl' or 'parquet'; a clear error for a missing file or an unknown extension."""
    p = Path(path)
    name = p.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        kind = "jsonl"
    elif name.endswith(PARQUET_SUFFIXES):
        kind = "parquet"
    else:
        raise ValueError(
            f"{path}: unknown conversation file type {p.suffix or '(no extension)'!r}; eyas "
            f"reads JSONL ({', '.join(JSONL_SUFFIXES)}: one JSON object per line) or Parquet "
            f"({', '.join(PARQUET_SUFFIXES)})")
    if not p.is_file():
        raise FileNotFoundError(f"{path}: conversation file not found")
    return kind


def _jsonl_lines(path: str) -> Iterator[tuple[int, bytes]]:
    # Binary, decoded per line: one bad byte sequence is one bad record, not a crashed file.
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():  # blank lines (e.g. a trailing one) are not records
                yield lineno, line


def _decode_json(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for non-UTF-8 bytes
        detail = (f"{e.msg} at character {e.pos + 1}" if isinstance(e, json.JSONDecodeError)
                  else str(e))
        raise InvalidRecord("malformed_json", (
            f"is not valid JSON ({detail}); each line must hold one complete JSON object "
            "(pretty-printed JSON spanning lines is not JSONL)")) from None


def _parquet_columns(path: str) -> list[str]:
    import pyarrow.parquet as pq

    names = pq.ParquetFile(path).schema_arrow.names
    columns = [key for key, _, _ in _STYLES if key in names]
    if not columns:  # a file-level mistake: refusing it beats skipping every row
        raise ValueError(f"{path}: no `messages` or `conversations` column (columns: {names})")
    return columns


def _parquet_rows(path: str) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=256,
                                                   columns=_parquet_columns(path)):
        for record in batch.to_pylist():
            row += 1
            yield row, record


def record_locations(path: str | os.PathLike) -> list[int]:
    """The locations `iter_records` would visit (cheap: JSON is not decoded)."""
    if file_kind(path) == "jsonl":
        return [lineno for lineno, _ in _jsonl_lines(str(path))]
    import pyarrow.parquet as pq

    _parquet_columns(str(path))
    return list(range(1, pq.ParquetFile(str(path)).metadata.num_rows + 1))


def iter_records(path: str | os.PathLike, on_bad_record: str = "error",
                 skipped: Optional[Counter] = None,
                 keep: Optional[Callable[[int], bool]] = None) -> Iterator[Record]:
    """Records of one JSONL or Parquet file. `keep(location)` selects records before they
    are decoded, so a bad record outside the selection is neither reported nor counted."""
    check_on_bad_record(on_bad_record)
    path = str(path)
    if file_kind(path) == "jsonl":
        rows, decode = _jsonl_lines(path), _decode_json
    else:
        rows, decode = _parquet_rows(path), (lambda record: record)
    for location, raw in rows:
        if keep is not None and not keep(location):
            continue
        try:
            messages = normalize_messages(decode(raw))
        except InvalidRecord as e:
            report_bad(BadRecordError(describe(path, location), e.reason, str(e)),
                       on_bad_record, skipped)
            continue
        yield Record(path, location, messages)


def iter_conversations(conversations: Iterable[Any], source: str = "conversations",
                       on_bad_record: str = "error",
                       skipped: Optional[Counter] = None) -> Iterator[Record]:
    """In-memory conversations (each a messages list or a record dict), validated the same way."""
    check_on_bad_record(on_bad_record)
    for index, conversation in enumerate(conversations):
        record = {"messages": conversation} if isinstance(conversation, list) else conversation
        try:
            messages = normalize_messages(record)
        except InvalidRecord as e:
            report_bad(BadRecordError(describe(source, index), e.reason, str(e)),
                       on_bad_record, skipped)
            continue
        yield Record(source, index, messages)
