"""Draft training without Ray: resume continues the same curve, NaN stops, output loads."""

from dataclasses import replace

import pytest
import torch

import eyas.train.loop as loop
from eyas.draft.directory import EXTRA_KEY, read_config
from eyas.draft.load import load
from eyas.draft.accuracy import DURING_TRAINING, DURING_TRAINING_COVERS
from eyas.store.reader import ExtractedDataset
from eyas.layout import LayoutError
from eyas.targets.parts import target_parts
from helpers import extract_tiny, tiny_train_settings, tiny_training_world

CFG, SETTINGS = tiny_train_settings()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    torch.set_num_threads(1)
    w = tiny_training_world(tmp_path_factory.mktemp("train"))
    return w.target, w.offline


def test_resume_continues_the_same_loss_curve(data, tmp_path):
    target, extract = data
    whole = loop.train_draft(str(extract), str(target), str(tmp_path / "a"), CFG, SETTINGS)
    assert whole.steps == 12 and len(whole.losses) == 12
    first = loop.train_draft(str(extract), str(target), str(tmp_path / "b"), CFG, SETTINGS,
                             stop_after=7)
    assert len(first.losses) == 7
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == [
        "step-0000003", "step-0000006"]
    second = loop.train_draft(str(extract), str(target), str(tmp_path / "b"), CFG, SETTINGS)
    assert second.resumed_from == 6
    torch.testing.assert_close(torch.tensor(second.losses), torch.tensor(whole.losses[6:]),
                               rtol=1e-6, atol=1e-7)
    a = loop.read_checkpoint(tmp_path / "a" / "checkpoints" / "step-0000012")
    b = loop.read_checkpoint(tmp_path / "b" / "checkpoints" / "step-0000012")
    for k in a["draft"]:
        torch.testing.assert_close(a["draft"][k], b["draft"][k], rtol=1e-6, atol=1e-7)
    assert whole.losses[-1] < whole.losses[0]


def test_a_stop_asked_mid_run_checkpoints_the_step_reached_and_the_resume_redoes_none(
        data, tmp_path):
    """The driver's stop request (eyas/train/stop.py, written at SIGTERM) seen at a step that
    is no periodic checkpoint's (every 3 here): that step is checkpointed and acknowledged, no
    draft is written, and the resume starts there, on the same loss curve."""
    from eyas.train import stop

    target, extract = data
    out = tmp_path / "b"
    whole = loop.train_draft(str(extract), str(target), str(tmp_path / "a"), CFG, SETTINGS)

    def log(step, metrics):
        if step == 4:  # asked during step 4: seen by every rank at step 5's all-reduce
            stop.request(out)

    first = loop.train_draft(str(extract), str(target), str(out), CFG, SETTINGS, log=log)
    assert len(first.losses) == 5
    assert stop.wait(out, 0) == {"step": 5,
                                 "checkpoint": str(out / "checkpoints" / "step-0000005")}
    assert not (out / "draft").exists()
    stop.clear(out)  # what the train stage does when it starts again
    second = loop.train_draft(str(extract), str(target), str(out), CFG, SETTINGS)
    assert second.resumed_from == 5
    torch.testing.assert_close(torch.tensor(second.losses), torch.tensor(whole.losses[5:]),
                               rtol=1e-6, atol=1e-7)


def test_checkpoints_are_safetensors_and_json_and_resume_bit_identically(data, tmp_path):
    """No pickle in eyas's training state: a checkpoint is state.safetensors + state.json,
    read back equal to what was saved (weights, optimizer moments and steps, param groups,
    step, identity, running accuracy); resuming from it continues exactly as training on:
    the same losses and the same final weights, bit for bit. The pickled state.pt an older
    eyas wrote is refused by name, not read."""
    import shutil

    target, extract = data
    whole = loop.train_draft(str(extract), str(target), str(tmp_path / "whole"), CFG, SETTINGS)
    loop.train_draft(str(extract), str(target), str(tmp_path / "new"), CFG, SETTINGS,
                     stop_after=7)
    step6 = tmp_path / "new" / "checkpoints" / "step-0000006"
    assert sorted(p.name for p in step6.iterdir()) == ["state.json", "state.safetensors"]
    state = loop.read_checkpoint(step6)
    assert state["step"] == 6 and set(state) == {"step", "draft", "optimizer", "identity",
                                                 "train_accuracy"}
    assert isinstance(state["optimizer"]["param_groups"][0]["betas"], tuple)
    assert all(isinstance(k, int) for k in state["optimizer"]["state"])
    # an older eyas's state.pt (torch.save of the same dict), the latest checkpoint
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "new", old)
    latest = sorted((old / "checkpoints").iterdir())[-1]
    torch.save(loop.read_checkpoint(latest), latest / "state.pt")
    (latest / "state.json").unlink()
    (latest / "state.safetensors").unlink()
    with pytest.raises(loop.CheckpointError, match=r"state.pt: a pickle .* never loads"):
        loop.train_draft(str(extract), str(target), str(old), CFG, SETTINGS)

    new = loop.train_draft(str(extract), str(target), str(tmp_path / "new"), CFG, SETTINGS)
    assert new.resumed_from == 6
    assert new.losses == whole.losses[6:]  # exactly
    _assert_same_tree(loop.read_checkpoint(tmp_path / "new" / "checkpoints" / "step-0000012"),
                      loop.read_checkpoint(tmp_path / "whole" / "checkpoints" / "step-0000012"))


def _assert_same_tree(a, b, where="state"):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same_tree(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tree(x, y, f"{where}/{i}")
    else:
        assert a == b or (a != a and b != b), where


class _WritesAFile:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):  # unpickling this creates the file
        return (open, (self.path, "w"))


def test_a_planted_pickle_checkpoint_is_refused_and_never_unpickled(data, tmp_path):
    """Whoever can write the run directory cannot make the next resume run code: a state.pt
    whose unpickling would write a file, planted as the latest checkpoint, is refused naming
    it (bad input, exit 2) and nothing in it runs; the finished checkpoints stay as they were."""
    from workflows.errors import BAD_INPUT, explain

    target, extract = data
    loop.train_draft(str(extract), str(target), str(tmp_path), CFG, SETTINGS, stop_after=3)
    good = tmp_path / "checkpoints" / "step-0000003"
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    canary = tmp_path / "unpickled"
    planted = tmp_path / "checkpoints" / "step-0000009"
    planted.mkdir()
    torch.save({"step": 9, "draft": _WritesAFile(canary)}, planted / "state.pt")
    with pytest.raises(loop.CheckpointError, match=r"checkpoint .*step-0000009/state.pt: a pickle "
                                                   r".*Remove .*step-0000009"):
        loop.train_draft(str(extract), str(target), str(tmp_path), CFG, SETTINGS)
    assert not canary.exists()
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    import io
    try:
        loop.read_checkpoint(planted)
    except loop.CheckpointError as e:
        out = io.StringIO()
        assert explain(e, stream=out) == BAD_INPUT and out.getvalue().startswith("eyas: ")
    # a damaged new-format checkpoint: refused naming it, not a safetensors traceback
    import shutil
    shutil.rmtree(planted)
    with open(good / "state.safetensors", "r+b") as f:
        f.truncate(100)
    with pytest.raises(loop.CheckpointError, match=r"checkpoint .*step-0000003 is damaged"):
        loop.train_draft(str(extract), str(target), str(tmp_path), CFG, SETTINGS)


def test_resume_keeps_what_training_measured_over_its_last_epoch(data, tmp_path):
    """The during-training accuracy (the gap alarm's reference) spans the whole last epoch
    (steps 7..12) even when a run stops inside it (at 10, checkpoint at 9) and resumes."""
    target, extract = data
    whole = loop.train_draft(str(extract), str(target), str(tmp_path / "a"), CFG, SETTINGS)
    loop.train_draft(str(extract), str(target), str(tmp_path / "b"), CFG, SETTINGS,
                     stop_after=10)
    resumed = loop.train_draft(str(extract), str(target), str(tmp_path / "b"), CFG, SETTINGS)
    assert resumed.resumed_from == 9
    assert whole.train_accuracy_steps == resumed.train_accuracy_steps == 6
    assert resumed.train_accuracy_tokens == whole.train_accuracy_tokens
    assert resumed.train_accuracy == pytest.approx(whole.train_accuracy, abs=1e-12)
    extra = read_config(resumed.draft_dir)[EXTRA_KEY]
    assert extra[DURING_TRAINING] == pytest.approx(whole.train_accuracy, abs=1e-12)
    assert extra[DURING_TRAINING_COVERS]["first_step"] == 7


def test_output_is_a_draft_that_loads_with_its_layout(data, tmp_path):
    target, extract = data
    outcome = loop.train_draft(str(extract), str(target), str(tmp_path), CFG, SETTINGS)
    layout = ExtractedDataset(extract).layout
    embed, _ = target_parts(target)
    loaded = load(outcome.draft_dir, embed, expected_layout=layout)
    assert loaded.layout == layout and loaded.draft.vocab.size == 128
    assert len(outcome.heldout_accuracy) == 2 and len(outcome.train_accuracy) == 2
    assert all(0 <= a <= 1 for a in outcome.heldout_accuracy + outcome.train_accuracy)
    assert (tmp_path / "train_report.json").exists()


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
        data, tmp_path, monkeypatch):
    target, extract = data
    real = loop.ttt_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        result = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 5:  # step index 4
            return result._replace(loss=result.loss * float("nan"))
        return result

    monkeypatch.setattr(loop, "ttt_loss", poisoned)
    with pytest.raises(loop.TrainingError, match=r"loss is nan at step 4.*step-0000003"):
        loop.train_draft(str(extract), str(target), str(tmp_path), CFG, SETTINGS)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-0000003"]


def test_resume_from_another_layouts_checkpoint_is_refused(data, tmp_path):
    target, extract = data
    loop.train_draft(str(extract), str(target), str(tmp_path), CFG, SETTINGS, stop_after=3)
    other = tmp_path / "other-extract"
    extract_tiny(target, extract.parent / "prepare", other,
                 slots=["block_out:0", "block_out:1", "block_out:2"], probe_samples=0)
    with pytest.raises(LayoutError, match="trained for another target or layout"):
        loop.train_draft(str(other), str(target), str(tmp_path), CFG, SETTINGS)


def test_batch_size_must_split_over_workers(data, tmp_path):
    target, extract = data
    with pytest.raises(ValueError, match="not divisible by train.num_workers=3"):
        loop.train_draft(str(extract), str(target), str(tmp_path), CFG, SETTINGS,
                         worker=loop.Worker(rank=0, world=3))


def test_lm_head_init_random_starts_elsewhere_than_the_targets_rows(data, tmp_path):
    target, extract = data
    warm = loop.train_draft(str(extract), str(target), str(tmp_path / "t"), CFG, SETTINGS,
                            stop_after=1)
    cold = loop.train_draft(str(extract), str(target), str(tmp_path / "r"),
                            replace(CFG, lm_head_init="random"), SETTINGS, stop_after=1)
    assert cold.losses[0] != pytest.approx(warm.losses[0], rel=1e-3)


def test_bfloat16_precision_computes_in_bfloat16_and_keeps_float32_weights(data, tmp_path):
    target, extract = data
    seen = {}

    def record(module, args, out):  # every Linear's output dtype, per setting
        if isinstance(module, torch.nn.Linear):
            seen.setdefault(setting, set()).add(out.dtype)

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        for setting in ("float32", "bfloat16"):
            loop.train_draft(str(extract), str(target), str(tmp_path / setting),
                             replace(CFG, precision=setting), SETTINGS, stop_after=3)
    finally:
        hook.remove()
    assert seen == {"float32": {torch.float32}, "bfloat16": {torch.bfloat16}}
    state = loop.read_checkpoint(tmp_path / "bfloat16" / "checkpoints" / "step-0000003")
    assert {t.dtype for t in state["draft"].values() if t.is_floating_point()} == {torch.float32}


def test_auto_precision_computes_in_bfloat16_only_where_this_cpu_has_it(data, tmp_path,
                                                                         monkeypatch):
    """train.precision=auto: float32 when oneDNN is capped below bfloat16 instructions (as on a
    CPU without avx512_bf16 or AMX), else what /proc/cpuinfo says this CPU has; recorded in
    the train report."""
    from cpu_flags import native_bf16_flags

    target, extract = data
    seen = {}

    def record(module, args, out):
        if isinstance(module, torch.nn.Linear):
            seen.setdefault(cap, set()).add(out.dtype)

    reports = {}
    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        for cap in ("AVX2", None):
            if cap:
                monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
            else:
                monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
            reports[cap] = loop.train_draft(str(extract), str(target), str(tmp_path / str(cap)),
                                            replace(CFG, precision="auto"), SETTINGS,
                                            stop_after=2)
    finally:
        hook.remove()
    here = torch.bfloat16 if native_bf16_flags() else torch.float32
    assert seen == {"AVX2": {torch.float32}, None: {here}}
    assert reports["AVX2"].precision == "float32"
    assert reports[None].precision == str(here).removeprefix("torch.")


def test_an_epoch_takes_every_sample_once_in_batches_of_like_length():
    from eyas.train.data import global_order, steps_per_epoch

    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 600, (203,), generator=gen).tolist()
    order = global_order(lengths, 8, seed=0, epoch=0)
    steps = steps_per_epoch(len(lengths), 8)
    assert len(order) == steps * 8 == len(set(order))  # the ragged last 3 left out, once
    padded = lambda o: sum(max(lengths[i] for i in o[b * 8:(b + 1) * 8]) * 8  # noqa: E731
                           for b in range(steps))
    shuffled = torch.randperm(len(lengths), generator=gen).tolist()[:steps * 8]
    assert padded(order) < 0.75 * padded(shuffled)  # padding: about a tenth, not two fifths
    # random still: another epoch or seed orders (and batches) otherwise
    assert order != global_order(lengths, 8, seed=0, epoch=1) != global_order(lengths, 8, 1, 0)


def test_the_label_cache_trains_the_same_draft_and_runs_the_head_once_per_sample(
        data, tmp_path, monkeypatch):
    """ce's labels held per sample (train.target_cache_gib): the same losses and weights to the
    bit as the head run every step, while the 49k-row head reads each training sample's rows
    once over both epochs instead of every time the sample is drawn."""
    from eyas.targets.parts import TargetHead

    target, extract = data
    rows = []
    forward = TargetHead.forward
    monkeypatch.setattr(TargetHead, "forward", lambda self, v: (rows.append(v.shape[0]),
                                                               forward(self, v))[1])
    # stop_after: the training steps alone, without the held-out score after them
    fresh = loop.train_draft(str(extract), str(target), str(tmp_path / "fresh"),
                             replace(CFG, target_cache_gib=0), SETTINGS, stop_after=12)
    fresh_rows, rows[:] = sum(rows), []
    cached = loop.train_draft(str(extract), str(target), str(tmp_path / "cached"), CFG, SETTINGS,
                              stop_after=12)
    cached_rows = sum(rows)
    assert CFG.loss == "ce" and CFG.target_cache_gib > 0
    assert cached.losses == fresh.losses  # bit for bit
    a = loop.read_checkpoint(tmp_path / "fresh" / "checkpoints" / "step-0000012")["draft"]
    b = loop.read_checkpoint(tmp_path / "cached" / "checkpoints" / "step-0000012")["draft"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # each of the 24 samples is drawn once per epoch (6 full batches of 4): the head ran on
    # its scored rows in the first epoch, as without the cache, and on none in the second
    assert len(ExtractedDataset(extract, "train")) == 24 and CFG.epochs == 2
    assert cached_rows > 0 and fresh_rows == 2 * cached_rows


def test_no_label_cache_is_kept_where_no_sample_comes_back(data, tmp_path, monkeypatch):
    """A run that ends in the epoch it starts in never reads a cached label back: it keeps
    none (8 bytes a token held for nothing: 266 MiB at the scale bench's 10^5 chats). A
    two-epoch run keeps one, and so does a resumed one that still has an epoch to go; one
    resumed in its last epoch does not."""
    built = []
    real = loop.TargetLabelCache
    monkeypatch.setattr(loop, "TargetLabelCache", lambda *a, **k: built.append(1) or real(*a, **k))
    target, extract = data
    one = replace(CFG, epochs=1)
    loop.train_draft(str(extract), str(target), str(tmp_path / "one"), one, SETTINGS,
                     stop_after=3)
    assert built == []
    loop.train_draft(str(extract), str(target), str(tmp_path / "two"), CFG, SETTINGS,
                     stop_after=3)  # steps 0-2 of 12: the second epoch to come
    assert built == [1]
    loop.train_draft(str(extract), str(target), str(tmp_path / "two"), CFG, SETTINGS,
                     stop_after=8)  # resumed at step 3, in the first epoch
    assert built == [1, 1]
    loop.train_draft(str(extract), str(target), str(tmp_path / "two"), CFG, SETTINGS,
                     stop_after=10)  # resumed at step 8, in the last epoch
    assert built == [1, 1]


def test_the_label_cache_keeps_to_its_budget_and_refuses_a_batch_without_ids(data):
    """Past train.target_cache_gib the cache stores nothing more but still gives every sample's
    labels (computed afresh); a batch without sample ids is refused, not mislabelled."""
    from eyas.draft.ttt import TargetLabelCache, _target_side, counted_rows
    from eyas.train.data import StoredData, batches

    target, extract = data
    ds = StoredData(extract)
    draft, head, vocab = loop.build_draft(ds, str(target), SETTINGS)
    (_, first), (_, second) = batches(ds, 4, 0, range(2), prefetch=0)
    full, small = TargetLabelCache(1 << 30), TargetLabelCache(1)
    for batch in (first, second, first):
        scored = counted_rows(batch, all_tokens=True)
        want, got = (c.labels(batch, head, vocab, draft.t2d, scored) for c in (full, small))
        assert torch.equal(want.choice, got.choice) and torch.equal(want.best, got.best)
        choice, _, best = _target_side(head, batch.verifier, scored, vocab, draft.t2d, "ce")
        assert torch.equal(want.choice, choice) and torch.equal(want.best, best[..., 0])
    assert small.bytes == 0 and not small.samples and small.computed == 12
    assert full.computed == 8 and len(full.samples) == 8
    assert full.bytes == 8 * int(first.attention_mask.sum() + second.attention_mask.sum())
    with pytest.raises(ValueError, match="sample_ids"):
        full.labels(replace(first, sample_ids=None), head, vocab, draft.t2d, scored)


def test_an_epochs_order_is_built_once_whatever_its_number_of_steps(data, monkeypatch):
    """Training reads each epoch's order once (built per step, an epoch cost O(N^2)); the
    batches are the ones `step_indices` gives step by step."""
    import eyas.train.data as train_data

    target, extract = data
    stored = train_data.StoredData(str(extract))
    builds = []
    real = train_data.global_order
    monkeypatch.setattr(train_data, "global_order",
                        lambda *a, **k: builds.append(a[3]) or real(*a, **k))
    per_epoch = train_data.steps_per_epoch(len(stored), 4)
    seen = [batch.sample_ids.tolist() for _, batch in train_data.batches(
        stored, 4, 0, range(0, 3 * per_epoch), prefetch=0)]
    assert per_epoch > 2 and builds == [0, 1, 2]
    assert seen == [train_data.step_indices(stored.lengths(), 4, 0, s)
                    for s in range(3 * per_epoch)]
