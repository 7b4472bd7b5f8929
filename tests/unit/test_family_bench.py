"""bench/family_bench.py's sides: a variant trains its family in its own shape under its own
name, and a family vLLM's CPU build cannot serve is refused through the command a user types,
before any run directory is read."""
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_the_small_dflash_block_is_dflash_in_its_own_shape():
    from family_bench import family_settings

    from eyas.config import DraftConfig, TrainConfig

    train, draft = TrainConfig(), replace(DraftConfig(), family="eagle3")
    t, d = family_settings("dflash-b4", train, draft, 3, published=True)
    assert (d.family, d.block_size, d.num_layers, t.anchors) == ("dflash", 4, 1, 32)
    t, d = family_settings("dflash", train, draft, 3, published=True)  # the reference's
    assert (d.block_size, d.num_layers, t.anchors, t.freeze_lm_head) == (16, 5, 32, True)
    assert abs(t.step_loss_decay - 0.8669) < 1e-4  # exp(-1/7): its gamma for blocks of 16


def test_eyas_bench_family_refuses_dspark_before_reading_the_run(capsys):
    from eyas import cli

    code = cli.main(["bench", "family", "/nonexistent/run", "dspark"])
    err = capsys.readouterr().err
    assert code != 0 and "dspark: vLLM's V1 runner (the CPU build) has no DSpark" in err
    assert "draft.family=dspark" in err and "/nonexistent" not in err
