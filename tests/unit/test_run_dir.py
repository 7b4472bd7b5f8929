"""The run directory without Ray: one writer, finished work moved aside, damage found."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workflows import pipeline
from workflows import run_dir as rd
from workflows.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]

HOLD_LOCK = """
import sys
sys.path.insert(0, {root!r})
from workflows.run_dir import RunDirLock
with RunDirLock({run_dir!r}):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_second_open_of_the_lock_is_refused_with_the_holder_and_the_fix(tmp_path):
    with rd.RunDirLock(tmp_path):
        with pytest.raises(rd.RunDirBusy) as refused:
            with rd.RunDirLock(tmp_path):
                pass
    message = str(refused.value)
    assert isinstance(refused.value, ConfigError)  # main() maps it to exit 2
    assert f"run_dir={tmp_path} is in use by another eyas run" in message
    assert f"pid {os.getpid()} on {socket.gethostname()}, started 20" in message
    assert "give this one another run_dir" in message
    with rd.RunDirLock(tmp_path):  # released: usable again
        pass


def test_a_run_is_refused_while_another_process_holds_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK.format(root=str(ROOT),
                                                                      run_dir=str(run_dir))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = load_config([f"run_dir={run_dir}", "stages=[prepare]"])
        with pytest.raises(rd.RunDirBusy, match=rf"in use by another eyas run: pid "
                                                rf"{holder.pid} on "):
            pipeline.run(cfg)
        assert sorted(p.name for p in run_dir.iterdir()) == [rd.LOCK]  # nothing written
    finally:
        holder.kill()  # dies holding the lock: the kernel releases it
        holder.wait()
    assert f"pid {holder.pid}" in (run_dir / rd.LOCK).read_text()  # its stale text stays
    with rd.RunDirLock(run_dir):  # and does not block
        assert f"pid {os.getpid()}" in (run_dir / rd.LOCK).read_text()


def _finished(run_dir: Path, name: str, key: str, content: str) -> Path:
    stage = run_dir / name
    stage.mkdir(parents=True)
    (stage / "out.txt").write_text(content)
    (stage / rd.STARTED).write_text(json.dumps({"key": key}))
    (stage / rd.MARKER).write_text(json.dumps({"key": key}))
    return stage


def test_finished_work_of_another_key_is_moved_aside_until_its_successor_finishes(tmp_path):
    stage = _finished(tmp_path, "extract", "old", "finished under the old key")
    rd.begin(tmp_path, "extract", "new")
    kept = rd.previous_dir(tmp_path, "extract")
    assert (kept / "out.txt").read_text() == "finished under the old key"
    assert sorted(p.name for p in stage.iterdir()) == [rd.STARTED]
    (stage / "partial.txt").write_text("the new attempt, killed")
    # a run with the old config again gets the old output back, not a redo
    assert not rd.restore(tmp_path, "extract", "another")
    assert rd.restore(tmp_path, "extract", "old")
    assert (stage / "out.txt").read_text() == "finished under the old key"
    assert not (stage / "partial.txt").exists() and not kept.exists()
    rd.begin(tmp_path, "extract", "new")
    (stage / rd.MARKER).write_text(json.dumps({"key": "new"}))
    assert kept.exists()
    rd.finish(tmp_path, "extract")
    assert not kept.exists()
    assert not rd.restore(tmp_path, "extract", "old")  # nothing is kept once replaced


def test_work_of_the_same_key_stays_and_unfinished_work_of_another_goes(tmp_path):
    stage = _finished(tmp_path, "extract", "k", "done")
    rd.begin(tmp_path, "extract", "k")  # a damaged stage redone in place
    assert (stage / "out.txt").exists() and not (stage / rd.MARKER).exists()
    rd.begin(tmp_path, "extract", "other")  # unfinished work under another key
    assert not (stage / "out.txt").exists()
    assert not rd.previous_dir(tmp_path, "extract").exists()
    assert json.loads((stage / rd.STARTED).read_text()) == {"key": "other"}


def test_a_garbled_marker_is_not_a_finished_stage(tmp_path):
    stage = _finished(tmp_path, "prepare", "k", "x")
    (stage / rd.MARKER).write_text('{"key": "k", "output_fin')
    assert rd.read_json(stage / rd.MARKER) is None
    rd.begin(tmp_path, "prepare", "other")  # still moved aside: it may be whole
    assert (rd.previous_dir(tmp_path, "prepare") / "out.txt").exists()


@pytest.fixture
def prepared(tmp_path):
    from eyas.config import DataConfig
    from eyas.conversations.prepare import prepare
    from helpers import conversations, tiny_tokenizer

    files = []
    for name, n in (("train", 12), ("heldout", 3)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations(n)))
        files.append(str(path))
    run_dir = tmp_path / "run"
    prepare(DataConfig(train_files=files[:1], heldout_files=files[1:]), tiny_tokenizer(),
            run_dir / "prepare", show_progress=False)
    return run_dir


def test_checksums_are_verified_when_a_file_changed_since_its_last_verification(
        prepared, monkeypatch):
    import eyas.conversations.prepare as prep

    hashed = []
    real = prep.sha256_file
    monkeypatch.setattr(prep, "sha256_file", lambda path: hashed.append(path.name) or real(path))
    rd.finish(prepared, "prepare")  # just written: recorded, not hashed again
    assert hashed == [] and rd.damage(prepared, "prepare") == {} and hashed == []
    split = prepared / "prepare" / "train.parquet"
    os.utime(split, ns=(split.stat().st_atime_ns, split.stat().st_mtime_ns + 10**9))
    assert rd.damage(prepared, "prepare") == {} and hashed == ["train.parquet"]
    assert rd.damage(prepared, "prepare") == {} and hashed == ["train.parquet"]  # recorded

    data = bytearray(split.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[(len(data) - footer) // 2] ^= 0xFF  # same size, footer intact
    split.write_bytes(bytes(data))
    assert rd.damage(prepared, "prepare") == {
        "train.parquet": "its checksum differs from the one recorded when it was written"}
    split.write_bytes(bytes(data[:-10]))
    assert "bytes" in rd.damage(prepared, "prepare")["train.parquet"]
    assert rd.damage(prepared, "train") == {}  # its outputs are all in its fingerprint


@pytest.mark.parametrize("finished", [False, True])
def test_regenerated_answers_survive_an_attempt_under_another_key(tmp_path, finished):
    """A changed key (here data.on_bad_record) redoes prepare, but the target's regenerated
    answers, which check their own inputs chunk by chunk, are kept: losing them cost a 640-chat
    run 15 minutes of regeneration."""
    from eyas.conversations.regenerate import CACHE_DIR

    stage = tmp_path / "prepare"
    (stage / CACHE_DIR).mkdir(parents=True)
    (stage / CACHE_DIR / "train-00000.jsonl").write_text("answers")
    (stage / "train.parquet").write_text("partial")
    (stage / rd.STARTED).write_text(json.dumps({"key": "old"}))
    if finished:
        (stage / rd.MARKER).write_text(json.dumps({"key": "old"}))
    rd.begin(tmp_path, "prepare", "new")
    assert (stage / CACHE_DIR / "train-00000.jsonl").read_text() == "answers"
    assert not (stage / "train.parquet").exists()
    assert json.loads((stage / rd.STARTED).read_text()) == {"key": "new"}
    kept = rd.previous_dir(tmp_path, "prepare")
    # finished work stays whole beside the new attempt until its successor finishes
    assert (kept / CACHE_DIR / "train-00000.jsonl").exists() == finished
    assert not (tmp_path / ".prepare.carried").exists()
