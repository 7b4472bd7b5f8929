"""Re-running the pipeline (real local Ray, real MLflow) over damaged outputs and failed changes.

One finished prepare + extract run is made per module; each test works on a copy of it
(copied with its mtimes, as a run directory moved between disks would be).
"""
import dataclasses
import json
import shutil

import mlflow
import pytest

from workflows import pipeline
from workflows.stages import STAGES, StageFailed

pytestmark = pytest.mark.integration

SHARD_FILES = ("safetensors", "parquet", "json")


def _args(run_dir, target_cache, name):
    return ["experiment=tiny", f"run_dir={run_dir}", "stages=[prepare,extract]",
            f"target.builtin.cache_dir={target_cache}", "extract.probe_samples=0",
            f"mlflow.run_name={name}"]


def _files(directory):
    """name -> (mtime, bytes) of every file in a stage directory."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes())
            for p in directory.iterdir() if p.is_file()}


def _stage_run(run_dir, name):
    mlflow.set_tracking_uri(f"sqlite:///{run_dir / 'mlflow.db'}")
    exp = mlflow.get_experiment_by_name("eyas")
    return next(r for r in mlflow.search_runs([exp.experiment_id], output_format="list")
                if r.info.run_name == name)


@pytest.fixture(scope="module")
def finished(ray_cluster, target_cache, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert pipeline.main(_args(run_dir, target_cache, "first")) == 0
    return run_dir


@pytest.fixture
def run_dir(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)  # copy2: mtimes kept to the nanosecond
    return copy


def test_a_damaged_shard_is_found_and_only_it_is_redone(run_dir, target_cache):
    extract = run_dir / "extract"
    manifest = json.loads((extract / "manifest.json").read_text())
    assert len(manifest["shards"]) >= 2
    victim = extract / "shard-train-00001.safetensors"
    intact = victim.read_bytes()
    damaged = bytearray(intact)
    damaged[-1] ^= 0xFF  # one byte of tensor data: size, header and manifest unchanged
    victim.write_bytes(bytes(damaged))
    before = _files(extract)

    assert pipeline.main(_args(run_dir, target_cache, "repair")) == 0
    after = _files(extract)
    redone = {f"shard-train-00001.{ext}" for ext in SHARD_FILES}
    rewritten = {name for name in before if after[name][0] != before[name][0]}
    assert {n for n in rewritten if n.startswith("shard-")} == redone
    assert all(after[n] == before[n] for n in before if n.startswith("shard-") and n not in redone)
    assert victim.read_bytes() == intact  # redone, to the same bytes
    assert json.loads((extract / "manifest.json").read_text()) == manifest
    run = _stage_run(run_dir, "repair/extract")
    assert "eyas.skipped" not in run.data.tags
    assert run.data.tags["eyas.repaired"] == ("shard-train-00001.safetensors: its checksum "
                                              "differs from the one recorded when it was written")
    assert run.data.metrics["resumed_shards"] == len(manifest["shards"]) - 1
    assert _stage_run(run_dir, "repair/prepare").data.tags["eyas.skipped"] == "up to date"


def test_a_truncated_prepared_split_is_redone_and_extract_stays_done(run_dir, target_cache):
    split = run_dir / "prepare" / "train.parquet"
    intact = split.read_bytes()
    split.write_bytes(intact[:len(intact) // 2])
    extract_before = _files(run_dir / "extract")

    assert pipeline.main(_args(run_dir, target_cache, "repair")) == 0
    assert split.read_bytes() == intact  # prepare writes the same bytes again...
    assert _files(run_dir / "extract") == extract_before  # ...so extract is not redone
    prepare = _stage_run(run_dir, "repair/prepare")
    assert prepare.data.tags["eyas.repaired"] == (f"train.parquet: {len(intact) // 2} bytes, "
                                                  f"{len(intact)} when written")
    assert _stage_run(run_dir, "repair/extract").data.tags["eyas.skipped"] == "up to date"


def test_a_changed_key_whose_run_fails_keeps_the_finished_stage(run_dir, target_cache,
                                                                 monkeypatch, capsys):
    extract, kept = run_dir / "extract", run_dir / "extract.previous"
    before = _files(extract)

    def crash(state):  # a worker dying partway through the new extraction
        (state.run_dir / "extract" / "shard-train-00000.safetensors").write_bytes(b"partial")
        raise StageFailed("extract: simulated crash")

    monkeypatch.setitem(STAGES, "extract", dataclasses.replace(STAGES["extract"], run=crash))
    changed = _args(run_dir, target_cache, "changed") + ["extract.samples_per_shard=5"]
    assert pipeline.main(changed) == 1
    assert "simulated crash" in capsys.readouterr().err
    assert _files(kept) == before  # the finished extraction, untouched
    monkeypatch.undo()

    assert pipeline.main(_args(run_dir, target_cache, "back")) == 0  # the earlier config
    assert _files(extract) == before and not kept.exists()  # restored, not redone
    run = _stage_run(run_dir, "back/extract")
    assert run.data.tags["eyas.skipped"] == "up to date"
    assert run.data.tags["eyas.restored"] == str(kept)
