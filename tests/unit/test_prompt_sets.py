"""Prompt sets a user brings to the serve benchmark (eyas/conversations/prompt_sets.py): every
shape the field's files come in, a bad line refused naming file, line and fix, and a chat
rendered through the target's template with the answers it got."""
import json

import pytest

from eyas.conversations.prompt_sets import (HELDOUT, Conversation, Dialog, PromptSetError,
                                            chat_renderer, read_prompt_file, read_prompt_sets)
from eyas.targets.tokenizer import train_tokenizer


def write(path, lines):
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_every_shape_reads_as_user_turns(tmp_path):
    f = write(tmp_path / "mixed.jsonl", [
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a"},
                      {"role": "user", "content": "q2"}]},
        {"conversations": [{"from": "human", "value": "sharegpt q"}]},
        {"turns": ["mt 1", "mt 2"]},
        {"prompt": "plain"}, {"text": "also plain"}, "a bare string"])
    s = read_prompt_file("mixed", f)
    assert [c.turns for c in s.conversations] == [
        ("q1", "q2"), ("sharegpt q",), ("mt 1", "mt 2"), ("plain",), ("also plain",),
        ("a bare string",)]
    assert s.conversations[0].system == "be brief"  # the file's assistant turn is dropped
    assert s.requests == 8


@pytest.mark.parametrize("line, says", [
    ('{"messages": [{"role": "user"}]}', "no `content`"),
    ('{"turns": []}', "`turns` must be a non-empty list"),
    ('{"question": "x"}', "has none of `messages`"),
    ('{"messages": [{"role": "assistant", "content": "a"}]}', "no user turn"),
    ('{"prompt": "x"', "not valid JSON"),
    ('[1, 2]', "is a JSON list"),
])
def test_a_bad_line_is_refused_naming_file_line_and_fix(tmp_path, line, says):
    f = tmp_path / "set.jsonl"
    f.write_text('{"prompt": "fine"}\n\n' + line + "\n")
    with pytest.raises(PromptSetError, match=says) as e:
        read_prompt_file("code", f)
    assert f"serve.prompt_sets.code={f}: line 3" in str(e.value)
    assert "fix or drop that line" in str(e.value)


def test_missing_files_other_formats_and_reserved_names_are_refused(tmp_path):
    with pytest.raises(PromptSetError, match="no such file"):
        read_prompt_sets({"code": str(tmp_path / "none.jsonl")})
    (tmp_path / "p.json").write_text("[]")
    with pytest.raises(PromptSetError, match="JSONL file"):
        read_prompt_sets({"code": str(tmp_path / "p.json")})
    (tmp_path / "ok.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(PromptSetError, match="held-out split"):
        read_prompt_sets({HELDOUT: str(tmp_path / "ok.jsonl")})


def test_a_chat_is_rendered_with_the_template_and_its_earlier_answer():
    tok = train_tokenizer(["def f(x):\n    return x\n" * 50, "hello world " * 50], 300)
    render, decode = chat_renderer(tok)
    d = Dialog(Conversation(system="sys", turns=("first", "second")), render, decode)
    first = d.prompt()
    assert tok.decode(first) == tok.apply_chat_template(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "first"}],
        tokenize=False, add_generation_prompt=True)
    answer = tok("return x", add_special_tokens=False)["input_ids"]
    d.answer(answer + [tok.eos_token_id] + answer)  # generated past EOS: cut at it
    second = tok.decode(d.prompt())
    assert second == tok.apply_chat_template(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "first"},
         {"role": "assistant", "content": "return x"}, {"role": "user", "content": "second"}],
        tokenize=False, add_generation_prompt=True)
    d.answer(answer)
    assert d.done
    tok.chat_template = None
    with pytest.raises(PromptSetError, match="no chat template"):
        chat_renderer(tok)
