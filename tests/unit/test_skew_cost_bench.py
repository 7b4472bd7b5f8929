"""bench/skew_cost.py forces a wrong feed on vLLM through a copy of the draft: the copy's
config gives the candidate's ids (both places vLLM reads), and for a permuted feed, which
vLLM cannot express (it sorts ids), the copy's fc (and norms) are rearranged so that, fed
the sorted slots, it computes what the original computes fed the permuted ones."""
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from eyas.conventions import vllm
from eyas.doctor.candidates import candidate_layouts
from eyas.draft.checkpoint import save_draft
from eyas.draft.eagle3.model import Eagle3Draft
from eyas.draft.load import load
from eyas.conventions import hf
from eyas.extract.shards import probe_slots
from helpers import tiny_setup

pytestmark = pytest.mark.usefixtures("one_thread")

_spec = importlib.util.spec_from_file_location(
    "skew_cost", Path(__file__).resolve().parents[2] / "bench" / "skew_cost.py")
skew_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(skew_cost)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    s = tiny_setup()
    config = dataclasses.replace(s.config, norm_before_fc=True, fc_norm=True)
    draft = Eagle3Draft(config, s.embed, s.vocab)
    with torch.no_grad():  # norms' gains away from 1, so a wrong rearrangement shows
        for p in [draft.input_norm.weight, *(n.weight for n in draft.fc_norm)]:
            p.uniform_(0.5, 1.5)
    out = tmp_path_factory.mktemp("skew") / "draft"
    save_draft(draft, s.layout, s.vocab, out)
    feats = hf.capture(s.target, s.ids, probe_slots(s.layout.target.num_layers))
    return s, out, feats


def _project(draft_dir, embed, slots, feats):
    draft = load(draft_dir, embed).draft.eval()
    with torch.no_grad():
        return draft.project(torch.cat([feats[s] for s in slots], dim=-1))


def test_a_permuted_feed_is_served_as_sorted_ids_with_fc_rearranged(saved, tmp_path):
    s, original, feats = saved
    permuted = [c.layout for c in candidate_layouts(s.layout) if c.kind == "permuted"]
    assert permuted
    for i, fed in enumerate(permuted):
        copy = tmp_path / str(i)
        ids = skew_cost.forced_copy(original, copy, s.layout, fed)
        config = json.loads((copy / "config.json").read_text())
        assert ids == sorted(vllm.to_ids(s.layout))  # the same slots, in vLLM's order
        assert config["eagle_aux_hidden_state_layer_ids"] == ids
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
        ascending = sorted(fed.draft_inputs, key=lambda slot: slot.stream_index())
        served = _project(copy, s.embed, ascending, feats)  # what vLLM gives the copy
        meant = _project(original, s.embed, fed.draft_inputs, feats)  # the permuted feed
        assert torch.allclose(served, meant, atol=1e-5), fed.names


def test_a_shifted_feed_is_the_same_weights_under_the_candidates_ids(saved, tmp_path):
    s, original, feats = saved
    fed = next(c.layout for c in candidate_layouts(s.layout) if c.kind == "shifted")
    ids = skew_cost.forced_copy(original, tmp_path / "copy", s.layout, fed)
    assert ids == vllm.to_ids(fed) != vllm.to_ids(s.layout)
    served = _project(tmp_path / "copy", s.embed, fed.draft_inputs, feats)
    meant = _project(original, s.embed, fed.draft_inputs, feats)
    assert torch.equal(served, meant)


def test_the_seeds_mistake_is_the_same_weights_recorded_one_block_later(saved, tmp_path):
    s, original, _ = saved
    trained, claimed = skew_cost.seeds_copy(original, tmp_path / "seeds")
    assert trained.names == s.layout.names
    assert [c.stream_index() for c in claimed.draft_inputs] == [
        t.stream_index() + 1 for t in trained.draft_inputs]
    config = json.loads((tmp_path / "seeds" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == vllm.to_ids(claimed)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == vllm.to_ids(claimed)
    assert load(tmp_path / "seeds", s.embed).claims.layout.names == claimed.names
    copy = load(tmp_path / "seeds", s.embed).draft.state_dict()
    for name, tensor in load(original, s.embed).draft.state_dict().items():
        assert torch.equal(copy[name], tensor), name


def test_a_draft_on_the_last_block_has_no_seeds_mistake_to_make(tmp_path):
    s = tiny_setup(slots=["block_out:1", "block_out:2", "block_out:3"])
    out = tmp_path / "draft"
    save_draft(Eagle3Draft(s.config, s.embed, s.vocab), s.layout, s.vocab, out)
    with pytest.raises(SystemExit, match=r"block_out:3.*cannot all be named one block later"
                                         r".*shifted by -1"):
        skew_cost.seeds_copy(out, tmp_path / "seeds")


def test_the_seeds_mistake_can_claim_the_runs_layout(saved, tmp_path):
    """A draft trained on [embed, early, middle] recorded as the run's [early, middle, late]."""
    from eyas.layout import HiddenStateLayout

    s, original, _ = saved
    run = HiddenStateLayout.from_names(s.layout.target, ["block_out:1", "block_out:2",
                                                         "block_out:3"])
    trained, claimed = skew_cost.seeds_copy(original, tmp_path / "seeds", run)
    assert trained.names == s.layout.names and claimed.names == run.names
    assert load(tmp_path / "seeds", s.embed).claims.layout.names == run.names
    two = HiddenStateLayout.from_names(s.layout.target, ["block_out:1", "block_out:2"])
    with pytest.raises(SystemExit, match="is not as many slots"):
        skew_cost.seeds_copy(original, tmp_path / "other", two)
