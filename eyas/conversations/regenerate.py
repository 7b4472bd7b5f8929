"""Regeneration: every assistant turn rewritten by the target itself (on-policy data).

A draft imitates the target, and serving continues the target's own text, so EAGLE-3 recipes
train on what the target says rather than on the dataset's answers. Each assistant turn is
replaced by the target's answer to the conversation so far, earlier turns already regenerated:

    [user u1, assistant a1, user u2, assistant a2]
    round 1: prompt render([u1], add_generation_prompt)            -> g1 replaces a1
    round 2: prompt render([u1, g1, u2], add_generation_prompt)    -> g2 replaces a2
User and system turns stay as they are. Rounds batch every conversation's turn of that rank.

A generation that is empty, or stopped by `max_new_tokens` before the target ended its turn
(truncated), is counted; the conversation is dropped (`on_truncated: drop`, the default) or a
truncated one kept (`keep`) and counted all the same. A turn whose context alone reaches
`data.max_length` tokens is left as it is: tokenization cuts it off anyway.

Records go through in chunks; each chunk's result is written atomically under
`cache_dir/<split>-<chunk>.jsonl` with a fingerprint of its inputs (sample ids, messages, the
generation settings, the target), so a killed run resumes at the first chunk not written.
The engine is any `complete(prompts, settings) -> [(token ids, finished)]`: vLLM in Ray actors
(tasks/prepare.py), or anything else that samples from the target.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from eyas.config import DataConfig, GenerationConfig
from eyas.files import atomic_write

logger = logging.getLogger(__name__)

CHUNK = 256  # records per cached chunk: the unit a resumed run redoes at most
CACHE_DIR = "regenerated"  # under the prepare stage's directory
# reasons a regenerated record is counted under (the prepare manifest's skip counts)
EMPTY, TRUNCATED = "regenerated_empty", "regenerated_truncated"

# complete(prompts [token ids], settings) -> per prompt (generated token ids, finished: the
# target ended its turn, not max_new_tokens)
Complete = Callable[[list[list[int]], GenerationConfig], list[tuple[list[int], bool]]]


@dataclass
class Outcome:
    """One conversation after regeneration."""

    messages: list[dict]
    turns: int = 0  # assistant turns regenerated
    problem: Optional[str] = None  # EMPTY or TRUNCATED (the first one met)
    left: int = 0  # turns left as they were: their context alone reaches data.max_length


@dataclass
class Counts:
    conversations: int = 0
    turns: int = 0
    left: int = 0
    empty: int = 0
    truncated: int = 0
    dropped: int = 0
    chunks_reused: int = 0
    per_split: dict = field(default_factory=dict)


def dropped(o: Outcome, settings: GenerationConfig) -> bool:
    """Whether a conversation is left out: an empty answer, or a cut-off one unless kept."""
    return o.problem == EMPTY or (o.problem == TRUNCATED and settings.on_truncated == "drop")


def regenerate_conversations(conversations: list[list[dict]], tokenizer, complete: Complete,
                             settings: GenerationConfig, max_length: int) -> list[Outcome]:
    """Each conversation with its assistant turns replaced, round by round (see above)."""
    out = [Outcome([dict(m) for m in messages]) for messages in conversations]
    rounds = max((sum(m["role"] == "assistant" for m in c) for c in conversations), default=0)
    for rank in range(rounds):
        todo, prompts = [], []
        for i, o in enumerate(out):
            if dropped(o, settings):
                continue  # its later turns are not worth generating
            positions = [j for j, m in enumerate(o.messages) if m["role"] == "assistant"]
            if rank >= len(positions):
                continue
            j = positions[rank]
            text = tokenizer.apply_chat_template(o.messages[:j], tokenize=False,
                                                 add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= max_length:
                o.left += 1  # the turn starts past data.max_length: it is cut off anyway
                continue
            todo.append((i, j))
            prompts.append(ids)
        if not prompts:
            continue
        for (i, j), (generated, finished) in zip(todo, complete(prompts, settings)):
            o = out[i]
            text = tokenizer.decode(generated, skip_special_tokens=True).strip()
            if not text:
                o.problem = o.problem or EMPTY
                continue
            if not finished:
                o.problem = o.problem or TRUNCATED
            o.messages[j] = {**o.messages[j], "content": text}
            o.turns += 1
    return out


def _fingerprint(items: list[tuple[str, list[dict]]], settings: GenerationConfig,
                 target_fingerprint: str, max_length: int) -> str:
    # what decides the answers: not how many replicas give them (a request's seed follows
    # from the prompt), so a run resumed on more or fewer replicas reuses every chunk
    how = {k: v for k, v in asdict(settings).items() if k != "num_replicas"}
    h = hashlib.sha256()
    h.update(json.dumps([how, target_fingerprint, max_length], sort_keys=True).encode())
    for sample_id, messages in items:
        h.update(json.dumps([sample_id, messages], sort_keys=True).encode())
    return h.hexdigest()


def _cached(path: Path, fingerprint: str) -> Optional[list[Outcome]]:
    try:
        lines = path.read_text().splitlines()
        head = json.loads(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    if head.get("fingerprint") != fingerprint or len(lines) - 1 != head.get("records"):
        return None
    return [Outcome(**json.loads(line)) for line in lines[1:]]


_COUNTED = ("conversations", "turns", "left", "empty", "truncated", "dropped")


def _count(counts: Counts, split_counts: dict, o: Outcome, kept: bool) -> None:
    for name, add in zip(_COUNTED, (1, o.turns, o.left, o.problem == EMPTY,
                                    o.problem == TRUNCATED, not kept)):
        setattr(counts, name, getattr(counts, name) + int(add))
        split_counts[name] += int(add)


class Regeneration:
    """The prepare stage's regeneration: one stream rewrite per split, the counts summed over
    both, and what the manifest says of it (`regenerated`)."""

    def __init__(self, data_cfg: DataConfig, tokenizer, complete: Optional[Complete],
                 target_fingerprint: str, engine: str, cache_dir: Path):
        if complete is None:
            raise ValueError("data.regenerate=true needs the target to generate with "
                             "(the prepare stage boots it)")
        self.cfg, self.tokenizer, self.complete = data_cfg, tokenizer, complete
        self.target_fingerprint, self.engine, self.cache_dir = (target_fingerprint, engine,
                                                                cache_dir)
        self.counts = Counts()

    def rewrite(self, split: str):
        return lambda records, need=None: self.regenerate(records, split, need)

    def regenerate(self, records: Iterable[tuple[str, object]], split: str,
                   need: Optional[Callable[[], int]] = None
                   ) -> Iterator[tuple[str, object, Optional[str]]]:
        """(sample id, record with its messages regenerated, problem or None) per record, in
        order; `records` yields (sample id, eyas.conversations.records.Record). A record whose
        problem drops it is still yielded: the caller counts it under that reason and leaves
        it out. `need()`: how many more records the caller can use (data.max_train and
        max_heldout less what it kept): a chunk is cut there, so no conversation is
        regenerated past the cap (a chunk of 256 held-out chats for 16 wanted was most of
        a 96-chat run's regeneration)."""
        tokenizer, complete, settings = self.tokenizer, self.complete, self.cfg.generation
        target_fingerprint, max_length = self.target_fingerprint, self.cfg.max_length
        cache_dir, counts = self.cache_dir, self.counts
        cache_dir.mkdir(parents=True, exist_ok=True)
        split_counts = counts.per_split.setdefault(split, dict.fromkeys(_COUNTED, 0))

        def flush(chunk, index):
            items = [(sid, record.messages) for sid, record in chunk]
            fingerprint = _fingerprint(items, settings, target_fingerprint, max_length)
            path = cache_dir / f"{split}-{index:05d}.jsonl"
            outcomes = _cached(path, fingerprint)
            if outcomes is None:
                outcomes = regenerate_conversations([m for _, m in items], tokenizer, complete,
                                                    settings, max_length)
                atomic_write(path, "\n".join([json.dumps({"fingerprint": fingerprint,
                                                          "records": len(outcomes)})]
                                             + [json.dumps(asdict(o)) for o in outcomes]) + "\n")
            else:
                counts.chunks_reused += 1
            for (sid, record), o in zip(chunk, outcomes):
                kept = not dropped(o, settings)
                _count(counts, split_counts, o, kept)
                yield sid, record._replace(messages=o.messages), None if kept else o.problem

        chunk, index = [], 0
        for item in records:
            chunk.append(item)
            if len(chunk) == CHUNK or (need is not None and len(chunk) >= need()):
                yield from flush(chunk, index)
                chunk, index = [], index + 1
        if chunk:
            yield from flush(chunk, index)

    def manifest(self) -> dict:
        c = self.counts
        logger.info("regenerated %d turns of %d conversations (%d cached chunks reused)",
                    c.turns, c.conversations, c.chunks_reused)
        return {"turns": "every assistant turn, in the context of the regenerated earlier ones",
                "how": asdict(self.cfg.generation), "engine": self.engine,
                "target_fingerprint": self.target_fingerprint,
                # not chunks_reused: a resumed or repaired run writes the same manifest
                **{k: v for k, v in asdict(c).items() if k != "chunks_reused"}}
