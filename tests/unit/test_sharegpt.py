"""ShareGPT as a data source: the packaged file (cut mid-record) read to its last complete
record, every quirk of real records handled and counted, a held-out cut no size trains on,
nested sizes."""
import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from eyas.config import DataConfig
from eyas.conversations import sharegpt
from eyas.conversations.prepare import prepare
from helpers import tiny_tokenizer


def _turn(speaker, value):
    return {"from": speaker, "value": value}


def _records(n):
    return [{"id": f"r{i}", "conversations": [_turn("human", f"question {i} " + "x" * (i * 37)),
                                              _turn("gpt", f"answer {i}")]} for i in range(n)]


@pytest.mark.parametrize("window", [16, 1 << 20])
def test_a_file_cut_mid_record_is_read_to_its_last_complete_record(tmp_path, window):
    """A JSON array cut inside its 7th record: the 6 before it, the cut counted; a window
    smaller than a record refills without losing or doubling any."""
    text = json.dumps(_records(7), indent=2)
    cut = text[:text.index('"id": "r6"') + 20]
    (tmp_path / "cut.json").write_text(cut)
    (tmp_path / "whole.json").write_text(text)
    counts = sharegpt.ReadCounts()
    ids = [r["id"] for r in sharegpt.iter_array(tmp_path / "cut.json", counts, window)]
    assert ids == [f"r{i}" for i in range(6)]
    assert not counts.complete and counts.cut_chars == len(cut) - cut.index('{\n    "id": "r6"')
    whole = sharegpt.ReadCounts()
    assert len(list(sharegpt.iter_array(tmp_path / "whole.json", whole, window))) == 7
    assert whole.complete and whole.cut_chars == 0


def test_the_packaged_file_gives_its_complete_conversations_and_counts_the_cut():
    counts = sharegpt.ReadCounts()
    kept = sum(1 for _ in sharegpt.conversations(counts))
    assert counts.records == 17671 and counts.cut_chars > 0 and not counts.complete
    assert kept + sum(counts.skipped.values()) == counts.records
    # its rarer speakers, each mapped and counted (ShareGPT V3's own: chatgpt 8, bing 4, bard 2,
    # user 2)
    assert {k: v for k, v in counts.fixed.items() if k.startswith("speaker_")} == {
        "speaker_chatgpt_as_assistant": 8, "speaker_bing_as_assistant": 4,
        "speaker_bard_as_assistant": 2, "speaker_user_as_user": 2}
    assert counts.fixed["assistant_first_dropped"] > 0 and counts.fixed["empty_turn_dropped"] > 0


def test_every_quirk_of_a_real_record_is_handled_and_counted():
    fixed = Counter()
    messages, why = sharegpt.clean({"conversations": [
        _turn("system", "be brief"), _turn("gpt", "(the end of an earlier part)"),
        _turn("human", "hi"), _turn("human", "are you there?"), _turn("bing", "  "),
        _turn("bard", "yes"), _turn("system", "late"), _turn("chatgpt", "how can I help?"),
        _turn("user", "thanks"), _turn("human", "")]}, fixed)
    assert why is None
    assert messages == [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": "hi\n\nare you there?"},
                        {"role": "assistant", "content": "yes\n\nhow can I help?"}]
    assert fixed == Counter(assistant_first_dropped=1, same_speaker_merged=2,
                            empty_turn_dropped=2, speaker_bard_as_assistant=1,
                            late_system_turn_dropped=1, speaker_chatgpt_as_assistant=1,
                            speaker_user_as_user=1, unanswered_turn_dropped=1)
    assert sharegpt.clean({"conversations": [_turn("human", "hi"), _turn("tool", "x")]},
                          Counter()) == (None, "unknown_speaker")
    assert sharegpt.clean({"conversations": [_turn("gpt", "only me")]},
                          Counter()) == (None, "no_assistant_turn")
    assert sharegpt.clean({"id": "x"}, Counter()) == (None, "no_conversations")


def _prepared(out, **caps):
    prepare(DataConfig(train_files=[sharegpt.SOURCE], max_length=256, on_bad_record="skip",
                       **caps), tiny_tokenizer(), out, show_progress=False)
    read = lambda split: pq.read_table(out / f"{split}.parquet").column(  # noqa: E731
        "sample_id").to_pylist()
    return read("train"), read("heldout"), json.loads((out / "manifest.json").read_text())


def test_sizes_are_nested_and_the_heldout_split_is_the_same_at_every_size(tmp_path):
    small, held_small, manifest = _prepared(tmp_path / "s", max_train=20, max_heldout=8)
    large, held_large, _ = _prepared(tmp_path / "l", max_train=50, max_heldout=8)
    assert len(small) == 20 and len(large) == 50 and large[:20] == small
    assert held_small == held_large and len(held_small) == 8
    assert not set(held_large) & set(large)
    assert all(sharegpt.is_heldout(s, manifest["heldout_from_train_fraction"])
               for s in held_small)
    read = manifest["splits"]["train"]["sharegpt"]
    assert read["records"] >= 20 and read["skipped"] is not None and "fixed" in read


def test_the_builtin_prompt_set_is_sharegpts_heldout_cut_replayed_turn_by_turn(tmp_path):
    from eyas.conversations.prompt_sets import read_prompt_file

    found = read_prompt_file("chat", "builtin:sharegpt")
    _, held, _ = _prepared(tmp_path / "p", max_train=5, max_heldout=3)
    first = found.conversations[:3]
    rows = pq.read_table(tmp_path / "p" / "heldout.parquet").to_pylist()
    assert len(found.conversations) > 500 and len(held) == 3
    # the held-out split's first conversations are the set's first: same user turns
    tok = tiny_tokenizer()
    for conversation, row in zip(first, rows):
        text = tok.decode(row["input_ids"])
        assert conversation.turns[0][:40] in text
    assert "held out" in found.source
