"""Prepare at users' scale: tokenized chunk by chunk into part files, so that a stopped run
resumes from its finished parts and chunks can be tokenized in parallel, with the split's
bytes the same as one pass writes them."""
from concurrent.futures import ThreadPoolExecutor

import pytest

import eyas.conversations.chunks as chunks
from eyas.conversations.prepare import prepare_split
from eyas.files import sha256_file
from helpers import conversations, tiny_tokenizer


def _data(n=60):
    convs = conversations(n, seed=3)
    convs[5] = [{"role": "user", "content": "only a question"}]  # no assistant turn
    return convs


def _split(tmp_path, name, convs, **kw):
    out = tmp_path / name / "train.parquet"
    stats = prepare_split(convs, tiny_tokenizer(), 128, "skip", out, "train",
                          show_progress=False, **kw)
    return sha256_file(out), {k: v for k, v in stats.items() if k != "path"}, out


@pytest.mark.parametrize("cap", [None, 37])
def test_chunked_parallel_output_is_one_passes_bytes(tmp_path, monkeypatch, cap):
    """The split tokenized as one chunk, in chunks of 7 here, and in chunks of 7 two at a time
    on a pool: the same file, byte for byte, and the same counts; with a cap that falls
    inside a chunk, the first `cap` kept samples all three ways. Row groups of 5 rows here:
    the merge cuts them across the parts as one pass would."""
    monkeypatch.setattr(chunks, "WRITE_BATCH", 5)
    one = _split(tmp_path, "one", _data(), max_samples=cap)
    monkeypatch.setattr(chunks, "CHUNK", 7)
    many = _split(tmp_path, "many", _data(), max_samples=cap)
    with ThreadPoolExecutor(2) as pool:
        def submit(items, path, key, max_length, on_bad_record):
            return pool.submit(chunks.tokenize_part, items, tiny_tokenizer(), max_length,
                               on_bad_record, path, key)
        parallel = _split(tmp_path, "pool", _data(), max_samples=cap, submit=submit, width=2)
    assert one[:2] == many[:2] == parallel[:2]
    assert one[1]["samples"] == (cap or 59) and one[1]["skipped"]
    assert not list((tmp_path / "many" / chunks.PARTS_DIR).glob("*"))  # removed once merged


def test_a_stopped_prepare_resumes_from_its_finished_parts(tmp_path, monkeypatch):
    """A run stopped in its fifth chunk (SIGTERM arrives as KeyboardInterrupt) keeps the four
    chunks it finished; the rerun tokenizes only the rest, and writes what an uninterrupted
    run writes. A part whose records changed is not reused."""
    monkeypatch.setattr(chunks, "CHUNK", 10)
    real = chunks.tokenize_conversation
    calls = []

    def counted(messages, *a):
        calls.append(1)
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(messages, *a)

    monkeypatch.setattr(chunks, "tokenize_conversation", counted)
    stop_at = None
    whole = _split(tmp_path, "whole", _data(), keep_parts=True)
    assert len(calls) == 59  # conversation 5 is left out as it is read
    calls.clear()
    stop_at = 45
    with pytest.raises(KeyboardInterrupt):
        _split(tmp_path, "run", _data(), keep_parts=True)
    assert len(list((tmp_path / "run" / chunks.PARTS_DIR).glob("*.json"))) == 4
    calls.clear()
    stop_at = None
    resumed = _split(tmp_path, "run", _data(), keep_parts=True)
    assert len(calls) == 19 and resumed[:2] == whole[:2]
    calls.clear()
    changed = _data()
    changed[12][0]["content"] += " (edited)"  # the second chunk's records differ
    _split(tmp_path, "run", changed, keep_parts=True)
    assert len(calls) == 10


def test_a_bad_record_in_a_chunk_is_the_users_error_not_the_pools(tmp_path, monkeypatch):
    """on_bad_record=error: the record's file and line in the error, as one pass gives it."""
    monkeypatch.setattr(chunks, "CHUNK", 4)
    path = tmp_path / "chat.jsonl"
    import json
    lines = [{"messages": c} for c in conversations(9)]
    lines[6] = {"messages": [{"role": "user", "content": "q"}]}
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(Exception, match="line 7"):
        prepare_split([str(path)], tiny_tokenizer(), 128, "error", tmp_path / "o.parquet",
                      "train", show_progress=False)


def test_a_worker_holds_one_write_batch_of_token_lists_not_a_chunk(tmp_path, monkeypatch):
    """A part of four write batches peaks at about what a part of one does (Python's traced
    allocations while tokenizing, the records themselves made before): the rows go to the
    file a batch at a time. Held as one chunk, the peak grew with the part (1.26x prepare's
    worker memory from 10^3 to 10^5 conversations in the scale record at commit bc196d7)."""
    import tracemalloc

    from eyas.conversations.records import Record

    monkeypatch.setattr(chunks, "WRITE_BATCH", 64)
    tokenizer = tiny_tokenizer()
    convs = [Record("mem", i, c) for i, c in enumerate(conversations(256, seed=5))]
    peaks = []
    for n in (64, 256):
        items = [(f"s{i}", r) for i, r in enumerate(convs[:n])]
        chunks.tokenize_part(items[:2], tokenizer, 128, "skip", tmp_path / "warm.parquet", "k")
        tracemalloc.start()
        stats = chunks.tokenize_part(items, tokenizer, 128, "skip", tmp_path / f"{n}.parquet",
                                     "k")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert stats["samples"] == n
    assert peaks[1] < 1.5 * peaks[0], peaks
