"""bench/store_read_bench.py: the store read at random with eyas's read advice and without, each
side from a dropped page cache, the same rows read."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import store_read_bench  # noqa: E402

import eyas.store.format as fmt  # noqa: E402
from helpers import tiny_store  # noqa: E402


def test_both_sides_read_the_same_rows_and_the_advice_is_put_back(tmp_path):
    _, base, _ = tiny_store(tmp_path)
    before = fmt._MADVISE
    advised = store_read_bench.read_side(base / "extract", [3, 0, 7, 5], "advised")
    plain = store_read_bench.read_side(base / "extract", [3, 0, 7, 5], "read-around")
    assert fmt._MADVISE is before is not None
    assert advised["used_bytes"] == plain["used_bytes"] > 0
    assert advised["disk_bytes"] >= 0 and plain["disk_bytes"] >= 0
    summary = store_read_bench.main([str(base / "extract"), "--samples", "6", "--rounds", "2",
                                     "--json", str(tmp_path / "r.json")])
    assert summary["read_around_over_advised_seconds"] > 0
    assert (tmp_path / "r.json").exists()
