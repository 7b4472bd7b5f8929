"""Every registered draft family (eyas/draft/families.py) holds to the same contract: the
config's choices are the registry's; its draft builds for a target, answers the model
interface, is written, read back as its own kind by the one loader with the same weights and
the same drafts, served with its speculative config on the ids its layout compiles to, and its
config rules refuse what belongs to another family. A family added to the registry is tested
here without a line of this file changing."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from eyas.config import DraftConfig, TrainConfig
from eyas.conventions import vllm, vllm_dflash, vllm_dspark
from eyas.conventions.vllm_checkpoint import DRAFT_ARCHITECTURES, read_mask_token_id
from eyas.conventions.kinds import FAMILY_KEY
from eyas.draft.directory import read_config
from eyas.draft.ttt import unroll
from eyas.draft.families import NAMES, REGISTRY
from eyas.draft.load import load, speculative_config
from eyas.conventions.kinds import KINDS, draft_kind
from eyas.draft.spec import DraftModel, ParallelDraft
from eyas.engines.vllm_checks import check_draft_for_target
from workflows.config import registered_choices
from helpers import tiny_setup

pytestmark = pytest.mark.usefixtures("one_thread")
SLOTS = ["block_out:0", "block_out:1", "block_out:2"]  # every family can be fed these
K = 3


def test_the_configs_choices_are_the_registry():
    field = next(f for f in dataclasses.fields(DraftConfig) if f.name == "family")
    assert registered_choices(field) == NAMES == tuple(REGISTRY)
    assert DraftConfig().family in REGISTRY
    for name, family in REGISTRY.items():
        assert family.name == name and KINDS[name] == family.kind


def _settings(name: str) -> DraftConfig:
    """DraftConfig for the family with what its rules resolve (a run's config does this)."""
    settings = DraftConfig(family=name, vocab_size=64, num_layers=None)
    resolved = REGISTRY[name].resolve(settings, TrainConfig(ttt_steps=K), K, False)
    return dataclasses.replace(settings, **resolved)


@pytest.fixture(params=NAMES)
def built(request, tmp_path):
    name = request.param
    s = tiny_setup(seq=12, slots=SLOTS)
    family = REGISTRY[name]
    draft = family.new_draft(s.cfg, len(SLOTS), s.vocab, s.embed, _settings(name))
    torch.manual_seed(1)
    with torch.no_grad():  # random weights, norms included: each is seen to matter
        for pname, p in draft.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * (0.3 if "norm" in pname else 0.05))
    target_dir = tmp_path / "target"
    target_dir.mkdir()
    (target_dir / "config.json").write_text(json.dumps(
        {**s.cfg.to_dict(), "architectures": ["LlamaForCausalLM"]}))
    out = family.save(draft.eval(), s.layout, s.vocab, tmp_path / "draft")
    return family, s, draft, out, target_dir


def test_a_new_draft_answers_the_model_interface(built):
    family, _, draft, _, _ = built
    assert isinstance(draft, DraftModel)
    # a family drafting a step in one pass says so, and its model drafts that way
    assert isinstance(draft, ParallelDraft) == (family.kind.block or family.kind.parallel_drafting)


def test_save_load_round_trips_as_its_own_kind(built):
    family, s, draft, out, _ = built
    config = read_config(out)
    assert config[FAMILY_KEY] == family.name and draft_kind(config) == family.kind
    loaded = load(out, s.embed, expected_layout=s.layout)
    assert type(loaded.draft) is type(draft) and loaded.layout == s.layout
    theirs, ours = loaded.draft.state_dict(), draft.state_dict()
    assert theirs.keys() == ours.keys()
    for name in ours:
        assert torch.equal(theirs[name], ours[name]), name
    positions = family.ttt_steps(_settings(family.name), TrainConfig(ttt_steps=K))
    with torch.no_grad():
        for a, b in zip(unroll(draft, s.ids, s.hidden, positions),
                        unroll(loaded.draft, s.ids, s.hidden, positions), strict=True):
            torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


def test_served_with_its_speculative_config_on_its_layouts_ids(built):
    family, s, _, out, target_dir = built
    config = read_config(out)
    speculative = speculative_config(config)
    assert speculative == family.speculative
    # the method and its parallel drafting fit the model vLLM builds from the config it reads
    # (the architecture each method's model is registered under, config/speculative.py)
    served_as = {DRAFT_ARCHITECTURES[0]: "eagle3", vllm_dflash.ARCHITECTURE: "dflash",
                 vllm_dspark.ARCHITECTURE: vllm_dspark.METHOD}
    (architecture,) = config["architectures"]
    assert served_as.get(architecture) == speculative["method"]
    assert family.kind.block == (speculative["method"] != "eagle3")
    assert bool(speculative.get("parallel_drafting")) == (
        not family.kind.block and read_mask_token_id(config) is not None)
    # what vLLM reads (the config without eyas's keys) says the same family as eyas's key
    engine_view = {k: v for k, v in config.items() if not k.startswith("eyas_")}
    assert draft_kind(engine_view) == family.kind
    ids = check_draft_for_target(target_dir, out, s.layout)
    assert ids == vllm.to_ids(s.layout)
    # vLLM drafts per step what the draft was trained to draft
    settings = _settings(family.name)
    assert family.served_k(settings, K) == family.ttt_steps(settings, TrainConfig(ttt_steps=K))


@pytest.mark.parametrize("name", NAMES)
def test_its_rules_refuse_what_is_another_familys(name):
    family, train = REGISTRY[name], TrainConfig(ttt_steps=K)
    if family.kind.block:  # its block of B is served as B-1 drafts (DSpark's: B)
        with pytest.raises(ValueError, match="draft.block_size=6 with serve.num_speculative"):
            family.resolve(DraftConfig(family=name, block_size=6), train, K, False)
        assert family.resolve(DraftConfig(family=name, block_size=6), train, K, True)[
            "block_size"] == 6  # serving another draft: its own block is its business
    else:
        for key, settings, run in (
                ("train.anchors", DraftConfig(family=name), dataclasses.replace(train, anchors=8)),
                ("draft.block_size", DraftConfig(family=name, block_size=4), train)):
            with pytest.raises(ValueError, match=f"^{key}="):
                family.resolve(settings, run, K, False)
        with pytest.raises(ValueError, match="exceeds train.ttt_steps"):
            family.resolve(DraftConfig(family=name), train, K + 1, False)
    deep = DraftConfig(family=name, num_layers=2)
    if family.max_layers == 1:
        with pytest.raises(ValueError, match="^draft.num_layers=2: .* one decoder layer"):
            family.resolve(deep, train, K, False)
    else:
        family.resolve(deep, train, K, False)


def test_its_loss_trains_every_weight(built):
    """One TTT loss over the positions the family trains: finite, and a gradient reaches every
    trainable weight: no part of the model is left untrained."""
    from eyas.draft.ttt import TTTBatch, ttt_loss
    from eyas.targets.parts import TargetHead

    family, s, draft, _, _ = built
    draft.train()
    positions = family.ttt_steps(_settings(family.name), TrainConfig(ttt_steps=K))
    result = ttt_loss(draft, TTTBatch(s.ids, s.hidden, s.verifier, s.mask),
                      TargetHead.from_model(s.target), positions)
    assert torch.isfinite(result.loss)
    result.loss.backward()
    untrained = [name for name, p in draft.named_parameters()
                 if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert not untrained, untrained
