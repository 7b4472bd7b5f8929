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


def test_a_curves_settings_change_its_familys_shape():
    """--set over --family's shape: DFlash's small block at the reference's anchor rate keeps
    the anchors asked for (the shape's 32 do not win), and the block stays the shape's."""
    from dataclasses import replace

    from size_bench import curve_settings

    from eyas.config import DraftConfig, TrainConfig

    train, draft = TrainConfig(), replace(DraftConfig(), family="eagle3")
    t, d = curve_settings(train, draft, "dflash-b4", ["anchors=192", "epochs=1"], 3)
    assert (t.anchors, t.epochs, d.family, d.block_size) == (192, 1, "dflash", 4)
    t, d = curve_settings(train, draft, None, ["epochs=2"], 3)
    assert (t.epochs, d.family) == (2, "eagle3")
