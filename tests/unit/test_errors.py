"""workflows.errors: eyas's error found inside Ray's wrappers, the exit code it means."""
import io
import pickle

import pytest

from eyas.conversations.records import BadRecordError
from eyas.layout import LayoutError
from eyas.train.loop import TrainingError
from workflows.errors import BAD_INPUT, FAILED_CHECK, LOST, debug_requested, explain


def test_eyas_errors_survive_pickling_with_their_fields():
    e = pickle.loads(pickle.dumps(BadRecordError("a.jsonl line 2", "no_assistant", "no reply")))
    assert str(e).startswith("a.jsonl line 2: no reply") and e.reason == "no_assistant"


def test_worker_failure_inside_ray_train_wrapper_is_a_failed_check():
    from ray.train import WorkerGroupError

    wrapped = WorkerGroupError("rank 0 failed", {0: TrainingError("loss is nan at step 3")})
    out = io.StringIO()
    assert explain(wrapped, stream=out) == FAILED_CHECK
    text = out.getvalue()
    assert text.startswith("eyas: loss is nan at step 3") and "Training failed" not in text


def test_a_worker_group_lost_with_its_node_says_resume_not_traceback():
    from ray.exceptions import ActorDiedError
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    died = WorkerHealthCheckFailedError("A worker health check failed.", ActorDiedError())
    lost = WorkerGroupError("rank 0 failed", {0: died, 1: RuntimeError("Connection reset")})
    out = io.StringIO()
    assert explain(lost, stream=out) == LOST
    text = out.getvalue()
    assert text.startswith("eyas: a worker died") and "run the same command to resume" in text
    # the same group failing for a bug inside the loop is no lost worker: its traceback stays
    with pytest.raises(WorkerGroupError):
        explain(WorkerGroupError("rank 0 failed", {0: ZeroDivisionError("a bug")}),
                stream=io.StringIO())


def test_chained_layout_error_is_bad_input():
    try:
        try:
            raise LayoutError("slot block_out:9 is out of range")
        except LayoutError as inner:
            raise RuntimeError("stage crashed") from inner
    except RuntimeError as e:
        out = io.StringIO()
        assert explain(e, stream=out) == BAD_INPUT
    assert out.getvalue().startswith("eyas: slot block_out:9 is out of range")


def test_unknown_errors_keep_their_traceback():
    with pytest.raises(ZeroDivisionError):
        explain(ZeroDivisionError("a bug"), stream=io.StringIO())


def test_debug_flag_is_taken_out_of_the_overrides(monkeypatch):
    monkeypatch.delenv("EYAS_DEBUG", raising=False)
    assert debug_requested(["a=1", "--debug"]) == (True, ["a=1"])
    assert debug_requested(["a=1"]) == (False, ["a=1"])
    monkeypatch.setenv("EYAS_DEBUG", "1")
    assert debug_requested(["a=1"])[0]


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB file system (tmpfs), where the machine lets a test mount one."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs is not permitted here")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_named_and_leaves_finished_files_intact(small_disk):
    from eyas.files import atomic_write, sha256_file

    finished = small_disk / "shard-00000.safetensors"
    digest = atomic_write(finished, b"x" * 100_000)
    target = small_disk / "shard-00001.safetensors"
    with pytest.raises(OSError) as caught:
        atomic_write(target, (b"y" * 65536 for _ in range(64)))  # 4 MiB into 1 MiB
    assert caught.value.filename == str(target)
    assert sorted(p.name for p in small_disk.iterdir()) == [finished.name]  # no half file
    assert sha256_file(finished) == digest
    out = io.StringIO()
    assert explain(caught.value, stream=out) == BAD_INPUT
    text = " ".join(out.getvalue().split())  # the paragraph unwrapped
    assert text.startswith(f"eyas: {target}: no space left on device")
    assert "run the same command again" in text and "Traceback" not in text
