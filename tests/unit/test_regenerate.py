"""Regeneration (eyas/conversations/regenerate.py): every assistant turn is the target's own answer in
the context of its earlier regenerated turns; empty and truncated generations are counted;
a killed run resumes from its cached chunks. The engine here is the trained world's target
sampled greedily with HF generate (the pipeline uses vLLM: tests/integration)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from eyas.config import DataConfig, GenerationConfig
from eyas.conversations.prepare import prepare
from eyas.conversations.regenerate import EMPTY, TRUNCATED, regenerate_conversations
from eyas.targets import load_tokenizer
from world import rule_conversations

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine(trained_world):
    model = AutoModelForCausalLM.from_pretrained(trained_world.target).eval()
    tok = load_tokenizer(trained_world.target)
    stop = [tok.eos_token_id, tok.convert_tokens_to_ids("<|end|>")]
    calls = []

    def complete(prompts, settings):
        calls.append(len(prompts))
        out = []
        for p in prompts:
            with torch.no_grad():
                ids = model.generate(torch.tensor([p]), max_new_tokens=settings.max_new_tokens,
                                     do_sample=False, eos_token_id=stop,
                                     pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
            finished = bool(ids) and ids[-1] in stop
            out.append((ids, finished))
        return out
    return tok, complete, calls


def two_turns():
    a, b = rule_conversations(2, seed=3)
    return [a[0], {"role": "assistant", "content": "zzzz"}, b[0],
            {"role": "assistant", "content": "yyyy"}]


def test_each_turn_is_the_targets_answer_to_the_regenerated_context(engine):
    tok, complete, _ = engine
    conv = [{"role": "system", "content": "letters"}] + two_turns()
    settings = GenerationConfig(max_new_tokens=24)
    (o,) = regenerate_conversations([conv], tok, complete, settings, max_length=512)
    assert o.turns == 2 and o.problem is None
    assert [m["role"] for m in o.messages] == [m["role"] for m in conv]
    assert [m["content"] for m in o.messages if m["role"] != "assistant"] == [
        m["content"] for m in conv if m["role"] != "assistant"]
    # independently: turn 2 answers the context holding turn 1's regenerated text, not "zzzz"
    for j in (2, 4):
        prompt = tok(tok.apply_chat_template(o.messages[:j], tokenize=False,
                                             add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]
        ids, finished = complete([prompt], settings)[0]
        assert finished and o.messages[j]["content"] == tok.decode(
            ids, skip_special_tokens=True).strip()
    assert "zzzz" not in o.messages[2]["content"] and "yyyy" not in o.messages[4]["content"]


def test_truncated_and_empty_generations_are_counted_not_kept_silently(engine):
    tok, complete, _ = engine
    short = GenerationConfig(max_new_tokens=2)  # the rule's answers are 8-14 letters
    (o,) = regenerate_conversations([two_turns()], tok, complete, short, 512)
    assert o.problem == TRUNCATED and o.turns == 1  # dropped: its second turn not generated
    kept = replace(short, on_truncated="keep")
    (o,) = regenerate_conversations([two_turns()], tok, complete, kept, 512)
    assert o.problem == TRUNCATED and o.turns == 2
    (o,) = regenerate_conversations([two_turns()], tok, lambda p, s: [([], True)] * len(p),
                                    short, 512)
    assert o.problem == EMPTY and o.turns == 0


def _data(n_train=6, **generation):
    from eyas.config import DemoDataConfig
    return DataConfig(regenerate=True, max_length=256, on_bad_record="error",
                      demo=DemoDataConfig(num_train=n_train, num_heldout=2),
                      generation=GenerationConfig(**generation))


@pytest.fixture(scope="module")
def rule_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("rule-data")
    for name, seed in (("train", 0), ("heldout", 1)):
        with open(base / f"{name}.jsonl", "w") as f:
            for conv in rule_conversations(6 if name == "train" else 2, seed):
                f.write(json.dumps({"messages": conv}) + "\n")
    return base


def test_prepare_regenerates_counts_and_resumes(engine, rule_files, tmp_path):
    tok, complete, calls = engine
    cfg = replace(_data(max_new_tokens=24), train_files=[str(rule_files / "train.jsonl")],
                  heldout_files=[str(rule_files / "heldout.jsonl")])
    out = tmp_path / "prepare"
    manifest = prepare(cfg, tok, out, complete=complete, target_fingerprint="t1",
                       engine="hf", show_progress=False)
    regen = manifest["regenerated"]
    assert regen["conversations"] == 8 and regen["turns"] == 8 and regen["dropped"] == 0
    assert regen["how"]["max_new_tokens"] == 24 and regen["engine"] == "hf"
    assert manifest["splits"]["train"]["samples"] == 6
    first = (out / "train.parquet").read_bytes()
    # a killed run: the tokenized outputs gone, the cached chunks left; nothing is generated
    for name in ("train.parquet", "heldout.parquet", "manifest.json"):
        (out / name).unlink()
    calls.clear()
    again = prepare(cfg, tok, out, complete=complete, target_fingerprint="t1", engine="hf",
                    show_progress=False)
    assert calls == [] and (out / "train.parquet").read_bytes() == first
    assert again == manifest
    # resumed on more replicas (the cluster grew): what was generated is reused, since a
    # request's seed follows from the prompt, not from which replica answers it
    (out / "manifest.json").unlink()
    more = replace(cfg, generation=replace(cfg.generation, num_replicas=4))
    prepare(more, tok, out, complete=complete, target_fingerprint="t1", engine="hf",
            show_progress=False)
    assert calls == [] and (out / "train.parquet").read_bytes() == first
    # another target (or setting): the cache does not match, so it is generated again
    prepare(cfg, tok, out, complete=complete, target_fingerprint="t2", engine="hf",
            show_progress=False)
    assert calls
    # truncations dropped: counted in the manifest and the split's skip counts
    short = prepare(replace(cfg, generation=GenerationConfig(max_new_tokens=2,
                                                             on_truncated="keep")),
                    tok, tmp_path / "short", complete=complete, target_fingerprint="t1",
                    engine="hf", show_progress=False)
    assert short["regenerated"]["truncated"] == 8 and short["regenerated"]["dropped"] == 0
    with pytest.raises(ValueError, match="no usable samples.*regenerated_truncated.*"
                                         "on_truncated=keep"):
        prepare(replace(cfg, generation=GenerationConfig(max_new_tokens=2)), tok,
                tmp_path / "dropped", complete=complete, target_fingerprint="t1",
                engine="hf", show_progress=False)


def test_a_capped_split_regenerates_no_conversation_past_its_cap(engine, rule_files, tmp_path):
    """data.max_train / max_heldout: the target answers only the conversations the split
    keeps (a chunk is cut at the cap), not a whole chunk of 256 read ahead: 16 held-out chats
    wanted from ShareGPT had 256 regenerated."""
    tok, complete, calls = engine
    cfg = replace(_data(max_new_tokens=24), train_files=[str(rule_files / "train.jsonl")],
                  heldout_files=[str(rule_files / "heldout.jsonl")], max_train=2, max_heldout=1)
    calls.clear()
    manifest = prepare(cfg, tok, tmp_path / "prepare", complete=complete,
                       target_fingerprint="t1", engine="hf", show_progress=False)
    assert manifest["splits"]["train"]["samples"] == 2
    assert manifest["splits"]["heldout"]["samples"] == 1
    assert sum(calls) == 3  # one turn each of the 2 + 1 conversations kept, and no more
