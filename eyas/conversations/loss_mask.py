"""The loss mask of a conversation rendered with the target's chat template.

It covers exactly the tokens the target would generate as the assistant: each assistant
turn's content plus the turn-closing text the template writes after it (e.g. `<|end|>\\n`).
They are found in characters, by rendering prefixes of the conversation, and mapped to tokens
with the fast tokenizer's offsets; the conversation is tokenized once, as a whole, so ids match
what the target sees at inference.

    messages  [user u, assistant a]
    before  = render([u], add_generation_prompt)  '<s><|user|>\\nu<|end|>\\n<|assistant|>\\n'
    upto    = render([u, a])                       before + 'a<|end|>\\n'
    span    = [len(before), len(upto))             -> 'a<|end|>\\n' in the full rendering
    a token is in the loss mask iff it carries a character of a span.

A token may straddle a span's start: byte-level BPE merges the template's '\n' with the
leading spaces of indented content ('\n   ' + ' return'). It carries assistant text, so it is
in the mask; the ids stay those of the one tokenization the target is run on.
"""
from __future__ import annotations

from typing import Sequence

from eyas.conversations.records import InvalidRecord

# Stands in for the first assistant turn when it opens the conversation (see assistant_spans).
_SENTINEL = "\ue000eyas-first-turn\ue000"


def _render(tokenizer, messages, add_generation_prompt=False) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja raise_exception(), e.g. "roles must alternate"
        raise InvalidRecord("template_error",
                            f"the chat template refused it: {type(e).__name__}: {e}") from None


def _divergence(prefix: str, text: str) -> str:
    i = next((k for k, (a, b) in enumerate(zip(prefix, text)) if a != b),
             min(len(prefix), len(text)))
    return f"at character {i}: {prefix[i:i + 30]!r} vs {text[i:i + 30]!r}"


def assistant_spans(messages: Sequence[dict], tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """The full rendering and the [start, end) character span of each assistant turn in it."""
    full = _render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        upto = _render(tokenizer, messages[: i + 1])
        if i == 0:
            # transformers refuses to render an empty conversation, so the generation prompt
            # before an opening assistant turn is found by rendering a sentinel in its place.
            probe = _render(tokenizer, [{"role": "assistant", "content": _SENTINEL}])
            before = probe[: probe.find(_SENTINEL)] if _SENTINEL in probe else None
        else:
            before = _render(tokenizer, messages[:i], add_generation_prompt=True)
        if before is None or not upto.startswith(before) or not full.startswith(upto):
            where = ("the template drops the content of an opening assistant turn"
                     if before is None else
                     _divergence(before, upto) if not upto.startswith(before) else
                     _divergence(upto, full))
            raise InvalidRecord("template_not_prefix_stable", (
                f"the chat template is not prefix-stable at messages[{i}] ({where}): "
                f"render(messages[:{i}], add_generation_prompt=True) must be a prefix of "
                f"render(messages[:{i + 1}]), itself a prefix of the whole rendering; eyas "
                "needs this to find the assistant's tokens (templates that rewrite earlier "
                "turns, e.g. drop their reasoning, are not supported)"))
        spans.append((len(before), len(upto)))
    return full, spans


def tokenize_conversation(messages: Sequence[dict], tokenizer, max_length: int
                          ) -> tuple[list[int], list[int], bool]:
    """(input_ids, loss_mask, truncated) of one conversation, cut to `max_length` tokens."""
    text, spans = assistant_spans(messages, tokenizer)
    # add_special_tokens=False: the template already writes BOS etc.; a second one is a skew.
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = list(encoding["input_ids"])
    loss_mask = [int(any(start < e and end > s for s, e in spans))
                 for start, end in encoding["offset_mapping"]]
    if not any(loss_mask):
        raise InvalidRecord("no_assistant_tokens", "the chat template rendered no assistant "
                            "tokens for it (empty assistant turns and no turn-closing text?)")
    truncated = len(input_ids) > max_length
    if loss_mask.index(1) >= max_length:
        raise InvalidRecord("empty_after_truncation", (
            f"has no assistant token within the first {max_length} tokens (the first is token "
            f"{loss_mask.index(1)} of {len(input_ids)}); raise data.max_length or shorten "
            "the prompt"))
    input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
    return input_ids, loss_mask, truncated
