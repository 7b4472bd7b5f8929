"""Online training through Ray: target replica actors stream each step's states through the
object store to the trainer. A replica killed mid-stream is restarted and the run trains the
very draft extract-then-train does, each sample once per epoch; a run stopped and resumed with
a new stream continues from its checkpoint's step; the pipeline runs online end to end."""
import json
from dataclasses import replace

import pytest
import ray
import torch

import eyas.train.loop as loop
from eyas.config import ExtractConfig, OnlineConfig
from eyas.store.reader import ExtractedDataset
from eyas.train.data import steps_per_epoch
from eyas.train.loop import read_checkpoint
from eyas.train.stream import OnlineStream
from helpers import tiny_train_settings, tiny_training_world
from tasks.online import start_stream, stop_stream, streamed_data
from workflows import pipeline

pytestmark = pytest.mark.integration

CFG, SETTINGS = tiny_train_settings()
EXTRACT = ExtractConfig(dtype="float32", batch_tokens=512)


@pytest.fixture(scope="module")
def world(tmp_path_factory, one_thread):
    w = tiny_training_world(tmp_path_factory.mktemp("online-ray"), online=True)
    offline = loop.train_draft(str(w.offline), str(w.target), str(w.base / "trained"), CFG,
                               SETTINGS)
    return w.target, w.base, w.manifest, offline


def _stream(world, replicas=1):
    target, base, manifest, _ = world
    layout = ExtractedDataset(base / "online", "probe").layout
    extract = ExtractConfig(**{**vars(EXTRACT), "num_replicas": replicas})
    feeder, actors = start_stream(str(target), layout, extract, "float32", base / "prepare",
                                  CFG, 0)
    data = streamed_data(OnlineStream(feeder, layout, str(base / "prepare"),
                                      manifest["totals"]["train"]["samples"]), CFG.batch_size,
                         str(base / "online"))
    return feeder, actors, data


def _weights(path):
    return read_checkpoint(sorted((path / "checkpoints").iterdir())[-1])["draft"]


def test_killed_replica_restarts_and_the_stream_trains_the_offline_draft(ray_cluster, world,
                                                                          tmp_path):
    target, base, _, offline = world
    feeder, replicas, data = _stream(world)
    before = ray.get(replicas[0].pid.remote())

    def kill_at_step_3(step, metrics):
        if step == 3:  # steps 4.. are queued or being computed on it
            ray.kill(replicas[0], no_restart=False)

    try:
        online = loop.train_draft(data, str(target), str(tmp_path), CFG, SETTINGS,
                                  log=kill_at_step_3)
        assert ray.get(replicas[0].pid.remote()) != before  # it died and was restarted
        report = stop_stream(feeder, replicas)
    except BaseException:
        stop_stream(feeder, replicas)
        raise
    assert report.computed_steps == offline.steps and report.most_queued <= 4
    per_epoch = steps_per_epoch(len(data), CFG.batch_size)
    for epoch in range(CFG.epochs):  # every sample once per epoch, none twice
        ids = [i for step, got in data.received if step // per_epoch == epoch for i in got]
        assert len(ids) == len(set(ids)) == per_epoch * CFG.batch_size
    torch.testing.assert_close(torch.tensor(online.losses), torch.tensor(offline.losses),
                               rtol=1e-5, atol=1e-6)
    trained = _weights(base / "trained")
    for name, value in _weights(tmp_path).items():
        torch.testing.assert_close(value, trained[name], rtol=1e-4, atol=1e-5, msg=name)


def test_resumed_online_run_continues_from_its_checkpoint_and_stream_position(ray_cluster, world,
                                                                              tmp_path):
    target, base, _, offline = world
    for stop_after in (7, None):  # stopped at 7 (checkpoint 6), then a new stream and resume
        feeder, replicas, data = _stream(world, replicas=2)
        try:
            outcome = loop.train_draft(data, str(target), str(tmp_path), CFG, SETTINGS,
                                       stop_after=stop_after)
        finally:
            report = stop_stream(feeder, replicas)
    assert outcome.resumed_from == 6 and data.received[0][0] == 6
    assert report.computed_steps == offline.steps - 6
    torch.testing.assert_close(torch.tensor(outcome.losses), torch.tensor(offline.losses[6:]),
                               rtol=1e-5, atol=1e-6)


def test_kept_epoch_is_reused_from_the_object_store_and_trains_the_same(ray_cluster, world,
                                                                       tmp_path):
    target, base, manifest, offline = world
    kept = replace(CFG, online=OnlineConfig(keep_epoch=True))
    layout = ExtractedDataset(base / "online", "probe").layout
    feeder, replicas = start_stream(str(target), layout, EXTRACT, "float32", base / "prepare",
                                    kept, 0)
    data = streamed_data(OnlineStream(feeder, layout, str(base / "prepare"), 24), CFG.batch_size,
                         str(base / "online"))
    try:
        outcome = loop.train_draft(data, str(target), str(tmp_path), kept, SETTINGS)
    finally:
        report = stop_stream(feeder, replicas)
    per_epoch = steps_per_epoch(24, CFG.batch_size)
    assert (report.computed_steps, report.reused_steps) == (per_epoch, per_epoch)
    torch.testing.assert_close(torch.tensor(outcome.losses), torch.tensor(offline.losses),
                               rtol=1e-5, atol=1e-6)


def test_two_ray_train_workers_online_equal_one_offline(ray_cluster, world, tmp_path):
    """Ray Train workers (a process group over gloo) each take their slice of every step
    from the stream: the draft is the one offline worker trains, norms summed over both."""
    from tasks.train import TrainJob, run_training

    target, base, manifest, offline = world
    two = replace(CFG, num_workers=2)
    layout = ExtractedDataset(base / "online", "probe").layout
    feeder, replicas = start_stream(str(target), layout, EXTRACT, "float32", base / "prepare",
                                    two, 0)
    try:
        run_training(TrainJob(str(base / "online"), str(target), str(tmp_path), two, SETTINGS,
                              online=OnlineStream(feeder, layout, str(base / "prepare"), 24),
                              threads=1))
    finally:
        stop_stream(feeder, replicas)
    report = json.loads((tmp_path / "train_report.json").read_text())
    torch.testing.assert_close(torch.tensor(report["losses"]), torch.tensor(offline.losses),
                               rtol=1e-4, atol=1e-5)
    trained = _weights(base / "trained")
    for name, value in _weights(tmp_path).items():
        torch.testing.assert_close(value, trained[name], rtol=1e-4, atol=1e-5, msg=name)
    # the fingerprints cover both ranks' samples: the whole first epoch (24 = 6 steps x 4)
    assert report["stream"]["norm_tokens"] == manifest["totals"]["train"]["tokens"]


def test_pipeline_online_stores_no_train_shard_and_runs_every_stage(ray_cluster, target_cache,
                                                                     tmp_path):
    code = pipeline.main(["experiment=tiny", f"run_dir={tmp_path}", "serve=reference",
                          "train.source=online", f"target.builtin.cache_dir={target_cache}",
                          "mlflow.run_name=online-it"])
    assert code == 0
    extract = tmp_path / "extract"
    stored = sorted(p.name for p in extract.iterdir() if not p.name.startswith((".", "_")))
    assert stored == ["manifest.json", "probe.json", "probe.parquet", "probe.safetensors",
                      *[f"shard-heldout-00000.{e}" for e in ("json", "parquet", "safetensors")]]
    manifest = json.loads((extract / "manifest.json").read_text())
    assert manifest["online"] and manifest["totals"]["train"]["samples"] > 0
    stream = json.loads((tmp_path / "train" / "stream.json").read_text())
    train = json.loads((tmp_path / "train" / "train_report.json").read_text())
    assert stream["computed_steps"] == train["steps"] and train["stream"]["received_steps"]
    assert train["heldout_accuracy"] and len(train["stream"]["norms"]) == 4
    evaluate = json.loads((tmp_path / "evaluate" / "report.json").read_text())
    assert evaluate["per_position_accuracy"]["train"]["full"]
    assert evaluate["predicted_tau"]["heldout"] >= 1.0
    serve = json.loads((tmp_path / "serve" / "report.json").read_text())
    assert serve["lossless"] and serve["tau"] >= 1.0
