"""bench/scale_bench.py's parts: the synthetic conversations it times the stages on, and what
it measures of a process tree."""
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import scale_bench  # noqa: E402


def test_synthetic_conversations_take_the_drawn_turn_lengths_scaled():
    lengths = [[400, 1200, 80], [40, 800, 16, 1600]]
    convs = scale_bench.synthetic(200, lengths, seed=1, scale=0.5)
    assert len(convs) == 200 and convs == scale_bench.synthetic(200, lengths, 1, 0.5)
    seen = set()
    for conv in convs:
        roles = [m["role"] for m in conv["messages"]]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert all(a != b for a, b in zip(roles, roles[1:]))
        chars = [len(m["content"]) for m in conv["messages"]]
        # each turn is its drawn length times the scale, to within one word
        source = next(s for s in lengths if len(s) in (len(chars), len(chars) + 1))
        assert all(-1 <= c - n * 0.5 < 12 for c, n in zip(chars, source)), (chars, source)
        seen.add(len(chars))
    assert seen == {2, 4}  # both sources drawn; the first's trailing user turn dropped


def test_the_sampler_sees_a_child_process_memory_reads_faults_and_cpu(tmp_path):
    """A child that waits, allocates and touches 200 MiB, reads a 30 MiB file and computes for
    a while: the sampler's peak for its title, its bytes read, its page faults (one a page
    touched) and its CPU time show each (the bench's memory, reading and CPU figures)."""
    data = tmp_path / "data"
    data.write_bytes(b"x" * (30 << 20))
    code = ("import time; time.sleep(0.5); b = bytearray(200 << 20); "
            "b[::4096] = b'y' * len(b[::4096]); "
            f"open({str(data)!r}, 'rb').read(); t = time.process_time(); "
            "exec('while time.process_time() - t < 0.6: pass'); time.sleep(1.0)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = scale_bench.Sampler(proc.pid, every=0.1)
    start = time.time()
    proc.wait()
    sampler.close()
    peaks = sampler.peaks(start - 1, time.time())
    assert max(peaks.values()) > 190 << 20, peaks
    assert sampler.read(start - 1, time.time()) >= 30 << 20
    cpu = sampler.cpu(start - 1, time.time(), "")
    assert cpu["minor_faults"] > 0.9 * (200 << 20) // 4096, cpu
    assert cpu["user_s"] + cpu["system_s"] > 0.5, cpu
    assert sampler.cpu(start - 1, time.time(), "no such title")["minor_faults"] == 0
    assert 0 < sampler.least_free(start - 1, time.time()) < 1 << 50
