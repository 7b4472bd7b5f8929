"""Online training without Ray: a stream computed step by step by the target trains the same
draft as extract-then-train; an online extraction stores the probe set and held-out split only; a stream that
delivers other samples than the plan's is refused; split recomputation matches the shards."""

import pytest
import torch

import eyas.train.loop as loop
from eyas.config import ExtractConfig
from eyas.store.reader import ExtractedDataset
from eyas.extract import blocks_forward, local_blocks
from eyas.extract.on_demand import PreparedRows, compute_samples, open_split
from eyas.train.data import rank_slice, step_indices, steps_per_epoch
from eyas.train.stream import StreamedData, StreamError
from helpers import tiny_train_settings, tiny_training_world

CFG, SETTINGS = tiny_train_settings()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.set_num_threads(1)
    w = tiny_training_world(tmp_path_factory.mktemp("online"), online=True)
    return w.target, w.base


def local_stream(target, base, skew=None):
    """StreamedData fed in this process, step by step, by the target's own blocks (what a
    replica's `produce` computes); `skew(step, indices)` may change what is delivered."""
    online = ExtractedDataset(base / "online", "probe")
    layout = online.layout
    forward = blocks_forward(local_blocks(str(target), layout.target.num_layers,
                                          ExtractConfig(), "float32"))
    rows = {s: PreparedRows(base / "prepare", s) for s in ("train", "heldout")}
    lengths = rows["train"].lengths()
    produced = []

    def fetch(step, rank):
        indices = rank_slice(step_indices(lengths, CFG.batch_size, CFG.seed, step),
                             rank, 1)
        if skew:
            indices = skew(step, indices)
        produced.append(step)
        return compute_samples([rows["train"][i] for i in indices], forward, layout.slots,
                               torch.float32, 0, 512)

    def heldout():
        return compute_samples(list(rows["heldout"]), forward, layout.slots, torch.float32, 0, 512)

    per_epoch = steps_per_epoch(len(rows["train"]), CFG.batch_size)
    return StreamedData(layout, base / "prepare", fetch, heldout, per_epoch), produced


def test_online_extraction_stores_the_probe_set_and_the_heldout_split_only(world):
    """No train shard; the held-out split stored as offline stores it (held in the trainer's
    memory instead, it grew with the data: 5 % of 200k conversations of a 70B target is
    ~650 GB), and read from disk by the trainer, evaluate and serve."""
    _, base = world
    names = sorted(p.name for p in (base / "online").iterdir() if not p.name.startswith("."))
    assert not [n for n in names if n.startswith("shard-train")]
    assert "manifest.json" in names and "probe.safetensors" in names
    offline = ExtractedDataset(base / "extract", "train").manifest
    online = ExtractedDataset(base / "online", "probe").manifest
    assert online["totals"] == offline["totals"]  # the splits' sizes, from the prepared data
    assert online["online"]["target_path"]
    assert {s["split"] for s in online["shards"]} == {"heldout"}
    stored = ExtractedDataset(base / "online", "heldout")
    assert isinstance(open_split(base / "online", "heldout"), ExtractedDataset)
    expected = ExtractedDataset(base / "extract", "heldout")
    assert [stored[i].sample_id for i in range(len(stored))] == [
        expected[i].sample_id for i in range(len(expected))]
    for name in expected.layout.names:
        torch.testing.assert_close(stored[0].slots[name], expected[0].slots[name])


def test_online_trains_the_same_draft_as_extract_then_train(world, tmp_path):
    target, base = world
    offline = loop.train_draft(str(base / "extract"), str(target), str(tmp_path / "off"), CFG,
                               SETTINGS)
    stream, produced = local_stream(target, base)
    online = loop.train_draft(stream, str(target), str(tmp_path / "on"), CFG, SETTINGS)
    assert produced == list(range(offline.steps))
    torch.testing.assert_close(torch.tensor(online.losses), torch.tensor(offline.losses),
                               rtol=1e-5, atol=1e-6)
    a = loop.read_checkpoint(tmp_path / "off" / "checkpoints" / "step-0000012")
    b = loop.read_checkpoint(tmp_path / "on" / "checkpoints" / "step-0000012")
    for k in a["draft"]:
        torch.testing.assert_close(b["draft"][k], a["draft"][k], rtol=1e-4, atol=1e-5)
    assert online.heldout_accuracy == pytest.approx(offline.heldout_accuracy, abs=1e-6)
    # the streamed norm fingerprints: the stored train shards' (same tokens, same states)
    stored = ExtractedDataset(base / "extract", "train").layout.norms
    assert online.online and not offline.online
    for slot, (mean, _) in online.stream.norms.items():
        assert mean == pytest.approx(stored[slot].mean, rel=0.05)
    assert online.stream.norm_tokens == ExtractedDataset(
        base / "online", "probe").manifest["totals"]["train"]["tokens"]
    # per epoch, every sample trained exactly once
    per_epoch = steps_per_epoch(len(stream), CFG.batch_size)
    for epoch in range(CFG.epochs):
        ids = [i for step, got in stream.received if step // per_epoch == epoch for i in got]
        assert len(ids) == len(set(ids)) == per_epoch * CFG.batch_size


def test_online_training_resumes_from_its_checkpoint_and_stream_position(world, tmp_path):
    target, base = world
    whole = loop.train_draft(local_stream(target, base)[0], str(target), str(tmp_path / "a"),
                             CFG, SETTINGS)
    loop.train_draft(local_stream(target, base)[0], str(target), str(tmp_path / "b"), CFG,
                     SETTINGS, stop_after=7)
    stream, produced = local_stream(target, base)
    resumed = loop.train_draft(stream, str(target), str(tmp_path / "b"), CFG, SETTINGS)
    assert resumed.resumed_from == 6 and produced[0] == 6  # the stream restarts at step 6
    torch.testing.assert_close(torch.tensor(resumed.losses), torch.tensor(whole.losses[6:]),
                               rtol=1e-6, atol=1e-7)


def test_a_stream_delivering_a_sample_twice_is_refused(world, tmp_path):
    target, base = world

    lengths = PreparedRows(base / "prepare", "train").lengths()

    def repeat(step, indices):  # step 2 gets step 1's first sample again
        return [step_indices(lengths, CFG.batch_size, CFG.seed, 1)[0], *indices[1:]] \
            if step == 2 else indices

    stream, _ = local_stream(target, base, skew=repeat)
    with pytest.raises(StreamError, match="step 2, rank 0.*trained twice or skipped"):
        loop.train_draft(stream, str(target), str(tmp_path), CFG, SETTINGS)


def test_open_split_recomputes_what_an_offline_extraction_stores(world):
    _, base = world
    stored = ExtractedDataset(base / "extract", "train")
    computed = open_split(base / "online", "train")
    assert len(computed) == len(stored)
    for i in range(len(stored)):
        a, b = stored[i], computed[i]
        assert a.sample_id == b.sample_id and torch.equal(a.input_ids, b.input_ids)
        for name in stored.layout.names:
            torch.testing.assert_close(b.slots[name], a.slots[name], rtol=1e-4, atol=1e-5)
    ids_only = open_split(base / "online", "train", states=False, max_samples=3)
    assert len(ids_only) == 3 and not ids_only[0].slots
