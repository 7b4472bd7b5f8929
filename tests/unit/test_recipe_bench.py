"""bench/recipe_bench.py's options for a recipe chosen on a subset: the peers, which train on
the whole extraction with the run's settings, are refused with them through the command a user
types, before the run is read."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_eyas_bench_recipe_refuses_a_peer_on_a_subset_before_reading_the_run(capsys):
    from eyas import cli

    code = cli.main(["bench", "recipe", "/nonexistent/run", "run", "run+speculators",
                     "--samples", "320"])
    err = capsys.readouterr().err
    assert code != 0 and "run+speculators: a peer trainer trains on the whole extraction" in err
    assert "/nonexistent" not in err


def test_a_variant_on_a_subset_trains_apart_from_the_whole_runs(tmp_path):
    """The first N samples' variant is kept under recipes/first-N/NAME: the whole run's
    trained variant (recipes/NAME) is neither reused for it nor removed by it."""
    import json
    from dataclasses import asdict

    from recipe_bench import train_variant

    from tests.helpers import tiny_train_settings, tiny_training_world

    w = tiny_training_world(tmp_path, n_train=16)
    run = tmp_path / "run"
    (run / "extract").parent.mkdir(parents=True, exist_ok=True)
    (run / "extract").symlink_to(w.offline)
    whole = run / "recipes" / "run"
    (whole / "checkpoints" / "step-00000004").mkdir(parents=True)
    train, draft = tiny_train_settings()
    (whole / "recipe.json").write_text(json.dumps({"settings": {
        "train": asdict(train), "draft": asdict(draft)}, "commit": "x"}))
    report = train_variant(run, "run", train, draft, w.target, samples=8)
    assert Path(report["draft_dir"]).is_relative_to(run / "recipes" / "first-8" / "run")
    assert report["settings"]["samples"] == 8
    assert (whole / "checkpoints" / "step-00000004").is_dir()
