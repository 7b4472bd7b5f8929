"""bench/size_bench.py's nested subsets: a draft trained at size N sees the extraction's first
N training samples and no other (the same ones at every larger N)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_a_size_trains_on_the_first_samples_only(tmp_path):
    from size_bench import FirstSamples

    from eyas.train.data import StoredData, batches
    from tests.helpers import tiny_training_world

    w = tiny_training_world(tmp_path, n_train=24)
    whole, part = StoredData(w.offline), FirstSamples(w.offline, 8)
    assert len(part) == 8 and part.lengths() == whole.lengths()[:8]
    assert [ids.tolist() for ids, _ in part.token_rows()] == [
        whole.train[i].input_ids.tolist() for i in range(8)]
    seen = set()
    for _, batch in batches(part, 4, 0, range(6)):  # three epochs of two steps
        seen |= set(batch.sample_ids.tolist())
    assert seen == set(range(8))
    with pytest.raises(SystemExit, match="holds 24 training samples"):
        FirstSamples(w.offline, 25)


def test_eyas_bench_size_refuses_a_family_it_cannot_shape_before_reading_the_run(capsys):
    from eyas import cli

    code = cli.main(["bench", "size", "/nonexistent/run", "80", "--family", "dflash-b8"])
    err = capsys.readouterr().err
    assert code != 0 and "--family dflash-b8" in err and "dflash-b4" in err
    assert "/nonexistent" not in err
