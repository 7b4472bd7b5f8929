"""bench/threads_bench.py's summary: every core's time per token over one thread's, paired
round by round, so that a machine drifting between rounds does not move the ratio."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from threads_bench import summary  # noqa: E402


def _boot(r, threads, ms, tokens_per_s):
    return {"round": r, "threads": threads, "ms_per_token_c1": ms, "tokens_per_s_c4": tokens_per_s}


def test_the_ratio_pairs_each_round_so_drift_between_rounds_cancels():
    # the machine twice as slow in round 1; two threads 0.9 of one's time in both rounds
    boots = [_boot(0, 1, 10.0, 400.0), _boot(0, 2, 9.0, 440.0),
             _boot(1, 2, 18.0, 220.0), _boot(1, 1, 20.0, 200.0)]
    s = summary(boots, 2)
    assert s["ratio_c1"] == 0.9 and s["ratio_c1_range"] == [0.9, 0.9]
    assert abs(s["speed_c4"] - 1.1) < 1e-12
    assert s["speed_c4_range"][1] - s["speed_c4_range"][0] < 1e-12
    assert [t["threads"] for t in s["per_threads"]] == [1, 2]
    assert s["per_threads"][0]["ms_per_token_c1"] == 15.0
