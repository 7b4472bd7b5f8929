"""The gap alarm end to end: eyas/train records what it measured WHILE training, and the doctor
holds the standalone measurement on the training shards to it.

Drafts here come from the real trainer (eyas.train.loop.train_draft) on the shared world's
extraction (test_evaluate.py): a target that learned a rule the draft can only read from the
target's states, so a draft fed other tensors than it trained on loses accuracy.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

import eyas.train.loop as loop
from eyas.config import DraftConfig
from eyas.config import TrainConfig
from eyas.draft.directory import EXTRA_KEY, read_config
from eyas.draft.checkpoint import save_draft
from eyas.draft.claims import FormatError
from eyas.draft.accuracy import DURING_TRAINING, DURING_TRAINING_COVERS
from eyas.doctor.gap import NOT_CHECKED
from eyas.doctor.run import diagnose_run
from eyas.store.writer import write_shard
from eyas.store.reader import ExtractedDataset
from eyas.train.data import steps_per_epoch
from world import STEPS, WORLD_DRAFT_VOCAB as DRAFT_VOCAB

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = TrainConfig(num_workers=1, ttt_steps=STEPS, epochs=20, batch_size=16, lr=3e-3,
                  step_loss_decay=0.8, checkpoint_every=1000, seed=0)
SETTINGS = DraftConfig(vocab_size=DRAFT_VOCAB)
_TRAINED: dict = {}


def _train(trained_world, out, monkeypatch=None, skew=False):
    """Run the real trainer; returns (outcome, the per-step counts it saw). With `skew`, the
    trainer's batches carry the first two slots swapped: a trainer that assembles its inputs
    otherwise than the layout it records (the seeds' bug, on the training side)."""
    seen = []
    real_loss, real_batches = loop.ttt_loss, loop.batches

    def counting(*args, **kwargs):
        result = real_loss(*args, **kwargs)
        seen.append([[float(s.correct), float(s.in_vocab)] for s in result.steps])
        return result

    def swapped(*args, **kwargs):
        for step, batch in real_batches(*args, **kwargs):
            a, b, rest = batch.hidden.split([trained_world.layout.target.hidden_size] * 2 + [
                batch.hidden.shape[-1] - 2 * trained_world.layout.target.hidden_size], dim=-1)
            yield step, replace(batch, hidden=torch.cat([b, a, rest], dim=-1))

    patch = monkeypatch or pytest.MonkeyPatch()
    patch.setattr(loop, "ttt_loss", counting)
    if skew:
        patch.setattr(loop, "batches", swapped)
    try:
        outcome = loop.train_draft(str(trained_world.data), str(trained_world.target), str(out), CFG, SETTINGS)
    finally:
        if monkeypatch is None:
            patch.undo()
    return outcome, torch.tensor(seen, dtype=torch.float64)  # [steps, k, (correct, in_vocab)]


def healthy(trained_world, tmp_path_factory):
    if "healthy" not in _TRAINED:
        _TRAINED["healthy"] = _train(trained_world, tmp_path_factory.mktemp("healthy-train"))
    return _TRAINED["healthy"]


def test_training_records_what_it_counted_over_its_last_epoch(trained_world, tmp_path_factory):
    outcome, seen = healthy(trained_world, tmp_path_factory)
    per_epoch = steps_per_epoch(len(trained_world.train_samples), CFG.batch_size)
    last = seen[-per_epoch:].sum(0)  # [k, (correct, in_vocab)]: sums of counts, not of ratios
    want = (last[:, 0] / last[:, 1]).tolist()
    extra = read_config(outcome.draft_dir)[EXTRA_KEY]
    assert extra[DURING_TRAINING] == pytest.approx(want, abs=1e-12)
    covers = extra[DURING_TRAINING_COVERS]
    assert covers["steps"] == per_epoch and covers["last_step"] == outcome.steps
    assert covers["scored_tokens"] == [int(v) for v in last[:, 1]]
    report = json.loads((Path(outcome.draft_dir).parent / "train_report.json").read_text())
    assert report["train_accuracy"] == pytest.approx(want, abs=1e-12)
    assert report["train_accuracy_steps"] == per_epoch
    assert "train_accuracy" not in extra  # no standalone re-run posing as training's figure


def test_a_healthy_trained_draft_raises_no_gap(trained_world, tmp_path_factory):
    outcome, _ = healthy(trained_world, tmp_path_factory)
    verdict = diagnose_run(trained_world.data, outcome.draft_dir, trained_world.target, steps=STEPS)
    # no gap and no fault; with the default norm options (norm_before_fc normalises the whole
    # concatenation) the layout evidence on this world's ~570 probe tokens may not decide
    # every neighbouring layout, and the doctor then says INCONCLUSIVE rather than OK
    assert not verdict.findings, verdict.explain()
    assert "measured during training" in verdict.reported.source
    assert verdict.train_accuracy.in_vocab[0] > 0.7  # a draft that learned: the check has teeth


def test_a_trainer_feeding_other_tensors_than_its_layout_raises_the_gap(trained_world, tmp_path,
                                                                        monkeypatch):
    outcome, _ = _train(trained_world, tmp_path, monkeypatch, skew=True)
    monkeypatch.undo()
    verdict = diagnose_run(trained_world.data, outcome.draft_dir, trained_world.target, steps=STEPS)
    assert "accuracy_gap" in verdict.names, verdict.explain()
    gap = verdict.findings[verdict.names.index("accuracy_gap")].message
    assert "measured during training over its last epoch" in gap
    # and the probe evidence names what the trainer really fed: block 1 and embed swapped
    assert verdict.best_layout.names == ["block_out:1", "embed", "block_out:3"]


def _reextracted_with_slots_swapped(trained_world, out):
    """A copy of the extraction whose train shards were rewritten (a re-extraction, checksums
    and all) with embed's and block_out:1's tensors swapped; the manifest's layout unchanged."""
    shutil.copytree(trained_world.data, out)
    manifest = json.loads((out / "manifest.json").read_text())
    layout = ExtractedDataset(out, "train").layout
    for i, record in enumerate(manifest["shards"]):
        if record["split"] != "train":
            continue
        name = record["name"]
        packed = load_file(str(out / f"{name}.safetensors"))
        packed["embed"], packed["block_out:1"] = packed["block_out:1"], packed["embed"]
        samples = pq.read_table(out / f"{name}.parquet").select(
            ["sample_id", "input_ids", "loss_mask"]).to_pylist()
        new = write_shard(out, name, "train", layout, samples, packed).to_dict()
        manifest["shards"][i] = {k: new[k] for k in record}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def test_training_shards_changed_since_training_raise_the_gap_naming_them(
        trained_world, tmp_path, tmp_path_factory):
    outcome, _ = healthy(trained_world, tmp_path_factory)
    data = _reextracted_with_slots_swapped(trained_world, tmp_path / "extract")
    verdict = diagnose_run(data, outcome.draft_dir, trained_world.target, steps=STEPS)
    assert verdict.names == ["accuracy_gap"], verdict.explain()
    message = verdict.findings[0].message
    assert "the tensors training read are not the ones in these training shards" in message
    assert "FAULT (accuracy_gap)" in verdict.explain()
    assert verdict.best_layout == trained_world.layout  # the probe split is untouched: layout not at fault


def test_a_draft_without_a_record_says_the_gap_was_not_checked(trained_world, tmp_path):
    foreign = save_draft(trained_world.draft, trained_world.layout, trained_world.vocab, tmp_path / "foreign")  # no eyas_extra
    verdict = diagnose_run(trained_world.data, foreign, trained_world.target, steps=STEPS)
    assert verdict.ok and verdict.train_accuracy is None
    note = next(n for n in verdict.notes if NOT_CHECKED in n)
    assert "no eyas_extra.train_accuracy_during_training" in note
    # a draft an eyas before versioned drafts wrote (its standalone re-run recorded as
    # eyas_extra.train_accuracy) is refused, not read as a past shape
    old = save_draft(trained_world.draft, trained_world.layout, trained_world.vocab, tmp_path / "old",
                     extra={"train_accuracy": [0.99] * STEPS})
    config = json.loads((old / "config.json").read_text())
    del config["eyas_format"]
    (old / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match=r"config.json: no eyas_format .* Retrain it"):
        diagnose_run(trained_world.data, old, trained_world.target, steps=STEPS)
    # given by hand, the same draft is checked
    verdict = diagnose_run(trained_world.data, foreign, trained_world.target, steps=STEPS, reported=[0.99] * STEPS)
    assert verdict.names == ["accuracy_gap"], verdict.explain()
