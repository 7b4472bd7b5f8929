"""The prepare stage: loss mask on exactly the assistant tokens, record validation, outputs."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eyas.config import DataConfig, DemoDataConfig
from eyas.conversations.loss_mask import tokenize_conversation
from eyas.conversations.prepare import (TokenizerMismatchError, check_tokenizer_matches,
                                        damaged_splits, demo_conversations, demo_source_split,
                                        prepare, prepare_split)
from eyas.extract.shards import plan_shards
from eyas.conversations.records import BadRecordError, iter_records
from eyas.fingerprint import chat_template_fingerprint, tokenizer_fingerprint
from eyas.targets.corpus import stdlib_sources
from eyas.targets.tokenizer import train_tokenizer
from helpers import read_prepared

QWEN_LIKE_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

MULTI_TURN = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "Sort a list xs."},
    {"role": "assistant", "content": "sorted(xs)"},
    {"role": "user", "content": "Now in reverse order."},
    {"role": "assistant", "content": "sorted(xs, reverse=True)"},
]


@pytest.fixture(scope="module")
def sources():
    return stdlib_sources()


@pytest.fixture(scope="module")
def tok(sources):
    texts, size = [], 0
    for f in sources.train:  # a few hundred KB is plenty for a 512-token vocabulary
        texts.append(f.text)
        size += len(f.text)
        if size > 300_000:
            break
    return train_tokenizer(texts, vocab_size=512)


@pytest.fixture(scope="module")
def chatml_tok(tok):
    t = copy.deepcopy(tok)
    t.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    t.chat_template = QWEN_LIKE_TEMPLATE
    return t


def write_jsonl(path: Path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return str(path)


def masked_and_unmasked(tokenizer, ids, mask):
    def decode(sel):
        return tokenizer.decode(sel, skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
    return (decode([i for i, m in zip(ids, mask) if m]),
            decode([i for i, m in zip(ids, mask) if not m]))


def masked_runs(tokenizer, ids, mask):
    runs, current = [], []
    for i, m in zip(ids, mask):
        if m:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(r, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            for r in runs]


def good(i=0):
    return {"messages": [{"role": "user", "content": f"Say {i}."},
                         {"role": "assistant", "content": f"print({i})"}]}


# ----- the loss mask -----------------------------------------------------------------------

def test_mask_covers_exactly_assistant_turns_and_their_end_tokens(tok):
    ids, mask, truncated = tokenize_conversation(MULTI_TURN, tok, max_length=512)
    assert not truncated and len(ids) == len(mask)
    masked, unmasked = masked_and_unmasked(tok, ids, mask)
    assert masked == "sorted(xs)<|end|>\nsorted(xs, reverse=True)<|end|>\n"
    assert masked_runs(tok, ids, mask) == ["sorted(xs)<|end|>\n",
                                           "sorted(xs, reverse=True)<|end|>\n"]
    assert unmasked == ("<s><|system|>\nYou write Python.<|end|>\n<|user|>\nSort a list xs."
                        "<|end|>\n<|assistant|>\n<|user|>\nNow in reverse order.<|end|>\n"
                        "<|assistant|>\n")
    # one tokenization of the whole rendering: ids are what the target sees
    assert ids == tok(tok.apply_chat_template(MULTI_TURN, tokenize=False),
                      add_special_tokens=False)["input_ids"]


def test_mask_with_a_chatml_template(chatml_tok):
    ids, mask, _ = tokenize_conversation(MULTI_TURN[1:], chatml_tok, max_length=512)
    masked, unmasked = masked_and_unmasked(chatml_tok, ids, mask)
    assert masked == "sorted(xs)<|im_end|>\nsorted(xs, reverse=True)<|im_end|>\n"
    assert "You are a helpful assistant." in unmasked  # the template's default system turn
    assert "Sort a list xs." in unmasked and "Now in reverse order." in unmasked
    assert "sorted" not in unmasked
    assert chatml_tok.convert_tokens_to_ids("<|im_end|>") in [i for i, m in zip(ids, mask) if m]


@pytest.mark.parametrize("which", ["tok", "chatml_tok"])
def test_conversation_opening_with_the_assistant(which, request):
    tokenizer = request.getfixturevalue(which)
    end = "<|end|>\n" if which == "tok" else "<|im_end|>\n"
    messages = [{"role": "assistant", "content": "import os"},
                {"role": "user", "content": "And sys?"},
                {"role": "assistant", "content": "import sys"}]
    ids, mask, _ = tokenize_conversation(messages, tokenizer, max_length=512)
    assert masked_and_unmasked(tokenizer, ids, mask)[0] == f"import os{end}import sys{end}"


def test_template_that_is_not_prefix_stable_names_the_record(tok, tmp_path):
    t = copy.deepcopy(tok)
    # drops every assistant turn but the last, as reasoning-stripping templates do
    t.chat_template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
                       "{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}"
                       "{% endif %}{% endfor %}"
                       "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": MULTI_TURN}])
    with pytest.raises(BadRecordError, match=r"chat\.jsonl line 1: .*not prefix-stable at "
                                             r"messages\[2\]") as e:
        prepare_split([path], t, 512, "error", tmp_path / "o.parquet", "train")
    assert e.value.reason == "template_not_prefix_stable"


def test_slow_tokenizer_is_refused(tmp_path):
    class Slow:
        is_fast = False
        name_or_path = "slow-one"
    with pytest.raises(TypeError, match="slow-one.*not a fast"):
        prepare_split([good()["messages"]], Slow(), 64, "error", tmp_path / "o.parquet", "train")


# ----- input formats ------------------------------------------------------------------------

def test_sharegpt_gives_the_same_samples_as_openai(tok, tmp_path):
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = {"conversations": [{"from": names[m["role"]], "value": m["content"]}
                                  for m in MULTI_TURN]}
    a = write_jsonl(tmp_path / "openai.jsonl", [{"messages": MULTI_TURN}])
    b = write_jsonl(tmp_path / "sharegpt.jsonl", [sharegpt])
    prepare_split([a], tok, 512, "error", tmp_path / "a.parquet", "train")
    prepare_split([b], tok, 512, "error", tmp_path / "b.parquet", "train")
    ta, tb = read_prepared(tmp_path / "a.parquet")[0], read_prepared(tmp_path / "b.parquet")[0]
    assert ta["input_ids"].to_pylist() == tb["input_ids"].to_pylist()
    assert ta["loss_mask"].to_pylist() == tb["loss_mask"].to_pylist()
    assert tb["sample_id"].to_pylist() == ["sharegpt:1"]


def test_parquet_input_works_as_jsonl(tok, tmp_path):
    records = [good(0), {"messages": MULTI_TURN}, good(2)]
    jsonl = write_jsonl(tmp_path / "chats.jsonl", records)
    parquet = tmp_path / "chats.parquet"
    pq.write_table(pa.table({"messages": [r["messages"] for r in records]}), parquet)
    assert [r.messages for r in iter_records(parquet)] == [r["messages"] for r in records]
    sj = prepare_split([jsonl], tok, 512, "error", tmp_path / "j.parquet", "train")
    sp = prepare_split([parquet], tok, 512, "error", tmp_path / "p.parquet", "train")
    tj, tp = read_prepared(tmp_path / "j.parquet")[0], read_prepared(tmp_path / "p.parquet")[0]
    assert tj.drop(["sample_id"]).equals(tp.drop(["sample_id"]))
    assert tp["sample_id"].to_pylist() == ["chats:1", "chats:2", "chats:3"]
    assert {k: v for k, v in sj.items() if k != "path"} == \
        {k: v for k, v in sp.items() if k != "path"}


def test_bad_parquet_row_names_the_row(tok, tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"messages": [good()["messages"],
                                          [{"role": "user", "content": "hi"}]]}), path)
    with pytest.raises(BadRecordError, match=r"rows\.parquet row 2: has no assistant turn"):
        prepare_split([path], tok, 512, "error", tmp_path / "o.parquet", "train")


def test_unknown_extension_and_missing_file(tok, tmp_path):
    (tmp_path / "chats.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"chats\.csv: unknown conversation file type '.csv'"):
        list(iter_records(tmp_path / "chats.csv"))
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl: conversation file not found"):
        prepare_split([str(tmp_path / "nope.jsonl")], tok, 512, "error",
                      tmp_path / "o.parquet", "train")


# ----- bad records --------------------------------------------------------------------------

BAD_RECORDS = {
    "malformed_json": ('{"messages": [', "not valid JSON"),
    "not_object": ("[1, 2]", "is a JSON list, not an object"),
    "missing_messages": ({"prompt": "hi"}, "has neither `messages`"),
    "missing_role_or_content": ({"messages": [{"role": "user"},
                                              {"role": "assistant", "content": "x"}]},
                                r"messages\[0\] has no `content` field"),
    "unknown_role": ({"messages": [{"role": "tool", "content": "x"},
                                   {"role": "assistant", "content": "y"}]},
                     r"messages\[0\] has role 'tool'"),
    "content_not_string": ({"conversations": [{"from": "human", "value": ["a"]},
                                              {"from": "gpt", "value": "b"}]},
                           r"conversations\[0\]\.value is list, not a string"),
    "no_assistant_turn": ({"messages": [{"role": "user", "content": "hi"}]},
                          "has no assistant turn"),
}


@pytest.mark.parametrize("reason", sorted(BAD_RECORDS))
def test_bad_record_names_file_line_and_problem(reason, tok, tmp_path):
    record, problem = BAD_RECORDS[reason]
    path = write_jsonl(tmp_path / "data.jsonl", [good(0), record, good(2)])
    with pytest.raises(BadRecordError, match=rf"data\.jsonl line 2: .*{problem}") as e:
        prepare_split([path], tok, 512, "error", tmp_path / "o.parquet", "train")
    assert e.value.reason == reason
    assert not (tmp_path / "o.parquet").exists()
    assert list(tmp_path.glob(".o.parquet.tmp-*")) == []  # no temp file left behind


def test_skip_counts_bad_records_by_reason_and_keeps_good_ones(tok, tmp_path):
    reasons = sorted(BAD_RECORDS)
    lines = [good(0)] + [BAD_RECORDS[r][0] for r in reasons] + ["", good(9)]  # "" is blank
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    stats = prepare_split([path], tok, 512, "skip", tmp_path / "o.parquet", "train")
    assert stats["skipped"] == {r: 1 for r in reasons}
    assert stats["samples"] == 2
    table, _ = read_prepared(tmp_path / "o.parquet")
    assert table["sample_id"].to_pylist() == ["mixed:1", f"mixed:{len(lines)}"]


def test_all_records_bad_is_an_error_even_when_skipping(tok, tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", ["[]", "{}"])
    with pytest.raises(ValueError, match="no usable samples.*'missing_messages': 1"):
        prepare_split([path], tok, 512, "skip", tmp_path / "o.parquet", "train")


# ----- truncation ---------------------------------------------------------------------------

def test_truncation_is_counted(tok, tmp_path):
    long_answer = {"messages": [{"role": "user", "content": "Count."},
                                {"role": "assistant", "content": " ".join(map(str, range(200)))}]}
    path = write_jsonl(tmp_path / "t.jsonl", [good(0), long_answer])
    stats = prepare_split([path], tok, 32, "error", tmp_path / "o.parquet", "train")
    table, _ = read_prepared(tmp_path / "o.parquet")
    assert stats["truncated"] == 1 and stats["samples"] == 2
    assert table["truncated"].to_pylist() == [False, True]
    assert table["num_tokens"].to_pylist()[1] == 32
    assert [len(x) for x in table["input_ids"].to_pylist()] == table["num_tokens"].to_pylist()
    assert [sum(m) for m in table["loss_mask"].to_pylist()] == \
        table["num_loss_tokens"].to_pylist()
    assert stats["tokens"] == sum(table["num_tokens"].to_pylist())


def test_empty_after_truncation(tok, tmp_path):
    long_prompt = {"messages": [{"role": "user", "content": "x = 1\n" * 100},
                                {"role": "assistant", "content": "ok"}]}
    path = write_jsonl(tmp_path / "e.jsonl", [good(0), long_prompt])
    with pytest.raises(BadRecordError, match=r"e\.jsonl line 2: has no assistant token within "
                                             r"the first 24 tokens") as e:
        prepare_split([path], tok, 24, "error", tmp_path / "o.parquet", "train")
    assert e.value.reason == "empty_after_truncation"
    stats = prepare_split([path], tok, 24, "skip", tmp_path / "o.parquet", "train")
    assert stats["skipped"] == {"empty_after_truncation": 1} and stats["samples"] == 1


# ----- outputs and the tokenizer check ------------------------------------------------------

def test_output_schema_metadata_and_tokenizer_check(tok, chatml_tok, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [good(0), good(1)])
    prepare_split([path], tok, 512, "error", tmp_path / "o.parquet", "heldout")
    raw = pq.read_schema(tmp_path / "o.parquet").metadata
    assert raw[b"eyas.tokenizer_fingerprint"] == tokenizer_fingerprint(tok).encode()
    assert raw[b"eyas.chat_template_fingerprint"] == chat_template_fingerprint(tok).encode()
    assert raw[b"eyas.split"] == b"heldout"
    table, meta = read_prepared(tmp_path / "o.parquet")
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert table.schema.field("num_tokens").type == pa.int32()
    check_tokenizer_matches(meta, tok)  # same tokenizer: no error

    other_template = copy.deepcopy(tok)
    other_template.chat_template = QWEN_LIKE_TEMPLATE
    with pytest.raises(TokenizerMismatchError) as e:
        check_tokenizer_matches(meta, other_template)
    assert chat_template_fingerprint(tok) in str(e.value)
    assert chat_template_fingerprint(other_template) in str(e.value)
    assert "tokenizer:" not in str(e.value)  # only the template differs
    with pytest.raises(TokenizerMismatchError, match=tokenizer_fingerprint(chatml_tok)):
        check_tokenizer_matches(meta, chatml_tok)  # two added tokens: another vocabulary


def test_prepare_holds_out_train_records_when_no_heldout_files(tok, tmp_path):
    path = write_jsonl(tmp_path / "all.jsonl", [good(i) for i in range(60)])
    cfg = DataConfig(train_files=[path], max_length=128)
    manifest = prepare(cfg, tok, tmp_path / "out")
    train, _ = read_prepared(tmp_path / "out" / "train.parquet")
    heldout, meta = read_prepared(tmp_path / "out" / "heldout.parquet")
    train_ids, heldout_ids = set(train["sample_id"].to_pylist()), set(
        heldout["sample_id"].to_pylist())
    assert len(heldout_ids) == 3 and not train_ids & heldout_ids
    assert train_ids | heldout_ids == {f"all:{i}" for i in range(1, 61)}
    assert meta["split"] == "heldout"
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["tokenizer_fingerprint"] == tokenizer_fingerprint(tok)
    assert manifest["chat_template_fingerprint"] == chat_template_fingerprint(tok)
    assert manifest["splits"]["train"]["samples"] == 57
    assert manifest["heldout_from_train_fraction"] == 0.05
    check_tokenizer_matches(manifest, tok)
    # deterministic: the same cut again
    prepare(cfg, tok, tmp_path / "again")
    again, _ = read_prepared(tmp_path / "again" / "heldout.parquet")
    assert set(again["sample_id"].to_pylist()) == heldout_ids


def test_prepare_with_heldout_files(tok, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [good(i) for i in range(4)])
    heldout = write_jsonl(tmp_path / "eval.jsonl", [good(9)])
    manifest = prepare(DataConfig(train_files=[train], heldout_files=[heldout]), tok,
                       tmp_path / "out")
    assert manifest["splits"]["train"]["samples"] == 4
    assert manifest["splits"]["heldout"]["samples"] == 1
    table, _ = read_prepared(tmp_path / "out" / "heldout.parquet")
    assert table["sample_id"].to_pylist() == ["eval:1"]


# ----- the demo set -------------------------------------------------------------------------

def test_demo_split_is_by_file_and_deterministic(tok, sources, tmp_path):
    pytest.importorskip("eyas.targets.builtin")
    files = sources.heldout[:8]
    cfg = DemoDataConfig(num_train=24, num_heldout=6, prompt_lines=4, completion_lines=3,
                         multi_turn_fraction=0.5, seed=3)
    train_files, heldout_files = demo_source_split(files, cfg)
    train_paths = {f.relpath for f in train_files}
    heldout_paths = {f.relpath for f in heldout_files}
    assert not train_paths & heldout_paths and heldout_paths
    assert train_paths | heldout_paths == {f.relpath for f in files}

    train, heldout = demo_conversations(cfg, files)
    assert (train, heldout) == demo_conversations(cfg, files)
    assert 0 < len(heldout) <= 6 and 0 < len(train) <= 24
    for conversation in heldout:  # every held-out answer comes from a held-out file
        answer = conversation[1]["content"]
        assert any(answer in f.text for f in heldout_files)
    assert demo_conversations(DemoDataConfig(**{**cfg.__dict__, "seed": 4}), files) != \
        (train, heldout)

    manifest = prepare(DataConfig(max_length=256, demo=cfg), tok, tmp_path / "demo",
                       demo_sources=files)
    assert manifest["demo"]["heldout_sources"] == sorted(heldout_paths)
    assert manifest["splits"]["heldout"]["samples"] == len(heldout)
    table, _ = read_prepared(tmp_path / "demo" / "heldout.parquet")
    assert table["sample_id"].to_pylist()[0] == "demo-heldout:0"


# ----- damage -------------------------------------------------------------------------------

def test_damaged_splits_names_each_damaged_file_and_same_bytes_again(tok, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [good(i) for i in range(6)])
    heldout = write_jsonl(tmp_path / "eval.jsonl", [good(9)])
    cfg = DataConfig(train_files=[train], heldout_files=[heldout])
    manifest = prepare(cfg, tok, tmp_path / "out")
    out = tmp_path / "out"
    assert damaged_splits(out) == {}
    assert manifest["splits"]["train"]["bytes"] == (out / "train.parquet").stat().st_size
    intact = (out / "train.parquet").read_bytes()

    (out / "train.parquet").write_bytes(intact[:len(intact) // 2])  # cut short
    assert "bytes" in damaged_splits(out, checksum=lambda path: False)["train.parquet"]
    with pytest.raises(ValueError, match=r"train\.parquet: unreadable .*damaged; re-run the "
                                         r"pipeline: the prepare stage is redone"):
        plan_shards(out, 8)  # the extract stage reading the prepared split

    flipped = bytearray(intact)
    footer = int.from_bytes(intact[-8:-4], "little")
    flipped[(len(intact) - footer) // 2] ^= 0xFF  # in the data: only the checksum sees it
    (out / "train.parquet").write_bytes(bytes(flipped))
    assert damaged_splits(out, checksum=lambda path: False) == {}
    assert "checksum" in damaged_splits(out)["train.parquet"]

    (out / "heldout.parquet").unlink()
    assert damaged_splits(out)["heldout.parquet"] == "missing"

    # redoing it writes the same bytes: what was made from it stays valid
    assert prepare(cfg, tok, out) == manifest
    assert (out / "train.parquet").read_bytes() == intact and damaged_splits(out) == {}


def test_a_chunk_elsewhere_is_tokenized_with_its_splits_settings(tok, sources, tmp_path):
    """prepare's submit (Ray tasks in the pipeline) is handed each split's own max_length and
    on_bad_record: the demo set skips a window too long whatever data.on_bad_record says (a
    pool that read the config's stopped tests/integration/test_stop.py's demo run on its
    first long window)."""
    from eyas.conversations.chunks import in_process

    seen = []

    def submit(items, path, key, max_length, on_bad_record):
        seen.append((max_length, on_bad_record))
        return in_process(tok)(items, path, key, max_length, on_bad_record)

    cfg = DemoDataConfig(num_train=24, num_heldout=6, prompt_lines=4, completion_lines=3)
    manifest = prepare(DataConfig(max_length=96, on_bad_record="error", demo=cfg), tok,
                       tmp_path / "demo", demo_sources=sources.heldout[:8], submit=submit)
    assert seen and set(seen) == {(96, "skip")}
    assert manifest["splits"]["train"]["samples"] > 0
