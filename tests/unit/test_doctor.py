"""The skew doctor: each injected fault is detected and named, a clean run raises no alarm.

Faults on the training side are drafts whose weights were trained on other tensors than their
checkpoint records (as the clean one, a few seconds each).
Faults on the serving side are features handed in as an engine would feed them.
"""
from __future__ import annotations

import copy
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.draft.checkpoint import save_draft
from eyas.draft.eagle3.model import Eagle3Draft
from eyas.draft.vocab import DraftVocab
from eyas.doctor import Diagnosis, ReportedAccuracy, diagnose, diagnose_run
from eyas.doctor.fingerprints import HandedFeatures
from eyas.store.reader import ExtractedDataset
from eyas.layout import HiddenStateLayout, TargetIdentity
from helpers import tiny_tokenizer
from world import STEPS, trained_on_slots

pytestmark = pytest.mark.usefixtures("one_thread")


def layout(trained_world, names, verifier="final_prenorm") -> HiddenStateLayout:
    return HiddenStateLayout.from_names(trained_world.layout.target, names, verifier)


def trained_on(trained_world, names, verifier="final_prenorm"):
    """(draft trained on these slots, what its training reported); its label stays clean."""
    draft, report = trained_on_slots(trained_world, names, verifier)
    return draft, report.train_accuracy


def doctor(trained_world, draft, reported=None, **kw):
    return diagnose(Diagnosis(draft, trained_world.layout, trained_world.data,
                              target_head=trained_world.head, steps=STEPS,
                              reported=ReportedAccuracy.given(reported) if reported else None,
                              **kw))


def test_clean_run_raises_no_alarm(trained_world):
    verdict = doctor(trained_world, trained_world.draft, reported=trained_world.reported)
    assert verdict.ok, verdict.explain()
    assert verdict.best_layout == trained_world.layout
    # what training counted while it trained lags the final weights: at most the tolerance
    # above the standalone measurement, so a healthy draft raises no gap
    assert all(r <= m + 0.05 for r, m in zip(trained_world.reported, verdict.train_accuracy.in_vocab))
    assert len(verdict.table) >= 10 and verdict.table[0].kind == "recorded"
    assert "skew doctor: OK" in verdict.explain()


@pytest.mark.parametrize("names,verifier,finding", [
    (["block_out:1", "block_out:3", "block_out:5"], "final_prenorm", "missing_embedding"),
    (["block_out:0", "block_out:2", "block_out:4"], "final_prenorm", "shifted"),
    (["embed", "block_out:1", "block_out:3"], "final_norm", "postnorm_verifier"),
])
def test_draft_trained_on_other_tensors_is_found(trained_world, names, verifier, finding):
    draft, reported = trained_on(trained_world, names, verifier)
    verdict = doctor(trained_world, draft, reported=reported)
    assert verdict.best_layout == layout(trained_world, names, verifier), verdict.explain()
    assert finding in verdict.names and "accuracy_gap" in verdict.names, verdict.explain()
    assert not verdict.ok


def test_a_draft_that_predicts_nothing_is_never_said_to_fit_other_slots(trained_world):
    """A random lm_head: the draft's likelihoods still differ between candidate layouts (by
    how garbage logits move), but no layout is what it fits: INCONCLUSIVE, saying why."""
    draft = copy.deepcopy(trained_world.draft)
    g = torch.Generator().manual_seed(2)  # one whose garbage "fits" a permutation, z -4.6
    with torch.no_grad():
        draft.lm_head.weight.copy_(torch.randn(draft.lm_head.weight.shape, generator=g))
    verdict = doctor(trained_world, draft)
    assert verdict.weighing.better is not None  # what the guard is for: a "better" fit
    assert verdict.fitted is None and not verdict.findings, verdict.explain()
    assert verdict.status == "INCONCLUSIVE"
    assert "say nothing about which slots it was trained on" in verdict.inconclusive


def test_permuted_slots_are_found(trained_world):
    """Swapping fc's column blocks makes exactly the draft trained on [block 1, embed, block 3]."""
    draft = Eagle3Draft(trained_world.draft_config, trained_world.embed, trained_world.vocab).eval()
    draft.load_state_dict(trained_world.draft.state_dict())
    with torch.no_grad():
        e, b1, b3 = trained_world.draft.fc.weight.chunk(3, dim=1)
        draft.fc.weight.copy_(torch.cat([b1, e, b3], dim=1))
    verdict = doctor(trained_world, draft)
    assert verdict.best_layout == layout(trained_world, ["block_out:1", "embed", "block_out:3"])
    assert verdict.names == ["permuted"], verdict.explain()
    assert "no vLLM id list serves it" in verdict.findings[0].message  # vLLM sorts its ids


def _fed(trained_world, names, with_ids: bool) -> HandedFeatures:
    """What an engine feeding `names` gives the draft, on the first probe samples."""
    probe = ExtractedDataset(trained_world.data, "probe")
    if with_ids:
        s = probe[3]
        return HandedFeatures([s.slots[n] for n in names], s.input_ids)
    rows = [torch.cat([probe[i].slots[n] for n in names], -1) for i in range(6)]
    return HandedFeatures.from_concat(rows, len(names))


@pytest.mark.parametrize("with_ids", [False, True])
def test_engine_feeding_blocks_but_not_the_embedding_is_named_with_the_fix(trained_world, with_ids):
    fed = ["block_out:1", "block_out:3", "block_out:5"]
    verdict = doctor(trained_world, trained_world.draft, features=_fed(trained_world, fed, with_ids))
    assert verdict.names == ["missing_embedding"], verdict.explain()
    assert verdict.engine_layout.names == fed
    assert [m.by for m in verdict.feature_matches] == ["tensors" if with_ids else "norms"] * 3
    message = verdict.findings[0].message
    assert "the engine feeds [block 1, block 3, block 5]" in message
    assert "trained on [embedding, block 1, block 3]" in message
    assert "vLLM ids (eyas.conventions.vllm.to_ids) [0, 2, 4]" in message
    assert verdict.best_layout == trained_world.layout  # the draft itself is fine


def test_engine_shifted_by_one_is_named(trained_world):
    fed = ["embed", "block_out:2", "block_out:3"]
    verdict = doctor(trained_world, trained_world.draft, features=_fed(trained_world, fed, with_ids=True))
    assert verdict.names == ["shifted"] and verdict.engine_layout.names == fed


def test_right_features_raise_no_alarm(trained_world):
    for with_ids in (False, True):
        verdict = doctor(trained_world, trained_world.draft, features=_fed(trained_world, trained_world.layout.names, with_ids))
        assert verdict.ok, verdict.explain()


def _resave(trained_world, tmp_path, draft=None, vocab=None, layout_=None):
    draft_dir = tmp_path / "draft"
    save_draft(draft or trained_world.draft, layout_ or trained_world.layout, vocab or trained_world.vocab, draft_dir)
    return draft_dir


def test_draft_for_another_target_is_flagged_naming_both(trained_world, tmp_path):
    t = trained_world.layout.target
    other = HiddenStateLayout(TargetIdentity(t.architecture, t.num_layers, t.hidden_size,
                                             "0123456789abcdef", t.tokenizer, t.chat_template),
                              trained_world.layout.draft_inputs, trained_world.layout.verifier)
    verdict = diagnose_run(trained_world.data, _resave(trained_world, tmp_path, layout_=other), trained_world.target)
    assert verdict.names == ["target_mismatch"], verdict.explain()
    message = verdict.findings[0].message
    assert other.target.fingerprint in message and t.fingerprint in message
    assert "0123456789abcdef" in message


def _accuracy(verdict) -> float:
    return verdict.table[0].accuracy.full[0]  # recorded layout, first draft position


def _clean(trained_world) -> float:
    return _accuracy(doctor(trained_world, trained_world.draft))


def _identity_draft(trained_world):
    size, total = trained_world.vocab.size, trained_world.vocab.target_vocab_size
    t2d = torch.zeros(total, dtype=torch.bool)
    t2d[:size] = True
    vocab = DraftVocab(torch.zeros(size, dtype=torch.int64), t2d)
    draft = Eagle3Draft(trained_world.draft_config, trained_world.embed, vocab)
    weights = {k: v for k, v in trained_world.draft.state_dict().items() if k not in ("d2t", "t2d")}
    draft.load_state_dict(weights, strict=False)
    return draft.eval(), vocab


def test_identity_d2t_is_flagged(trained_world, tmp_path):
    draft, vocab = _identity_draft(trained_world)
    verdict = diagnose_run(trained_world.data, _resave(trained_world, tmp_path, draft, vocab), trained_world.target)
    assert "d2t_identity" in verdict.names, verdict.explain()
    assert "map draft ids to the wrong target tokens" in verdict.explain()
    assert _accuracy(verdict) < _clean(trained_world) - 0.3  # and the evidence shows what it costs
    # zeros written over d2t alone (t2d left as trained): served as vLLM reads it, by d2t
    draft_dir = _resave(trained_world, tmp_path / "zeros")
    weights = load_file(str(draft_dir / "model.safetensors"))
    weights["d2t"] = torch.zeros_like(weights["d2t"])
    save_file(weights, str(draft_dir / "model.safetensors"))
    assert "d2t_identity" in diagnose_run(trained_world.data, draft_dir, trained_world.target).names


def test_missing_d2t_is_flagged(trained_world, tmp_path):
    draft_dir = _resave(trained_world, tmp_path)
    weights = load_file(str(draft_dir / "model.safetensors"))
    del weights["d2t"]
    save_file(weights, str(draft_dir / "model.safetensors"))
    verdict = diagnose_run(trained_world.data, draft_dir, trained_world.target)
    assert "d2t_missing" in verdict.names, verdict.explain()
    assert _accuracy(verdict) < _clean(trained_world) - 0.3


def test_chat_template_changed_since_prepare_is_flagged(trained_world, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(trained_world.target, target)
    tok = copy.deepcopy(tiny_tokenizer())  # the cached one is shared by every world built later
    tok.chat_template = tok.chat_template.replace("<|end|>", "<|end|> ")
    tok.save_pretrained(target)
    verdict = diagnose_run(trained_world.data, trained_world.draft_dir, target)
    assert verdict.names == ["chat_template_changed"], verdict.explain()
    assert "re-run prepare" in verdict.findings[0].message
    assert diagnose_run(trained_world.data, trained_world.draft_dir, trained_world.target).ok  # the unchanged target: clean


def test_verdict_serializes_for_the_report(trained_world):
    import json
    verdict = doctor(trained_world, trained_world.draft, features=_fed(trained_world, trained_world.layout.names, False))
    data = json.loads(json.dumps(verdict.to_dict()))
    assert data["ok"] and data["best_layout"]["draft_inputs"] == trained_world.layout.names
    assert len(data["table"]) == len(verdict.table) and data["explain"] == verdict.explain()


def test_without_a_probe_set_the_stored_slots_still_give_evidence(trained_world, tmp_path):
    import json
    data = tmp_path / "extract"
    shutil.copytree(trained_world.data, data)
    manifest = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**manifest, "probe": None}))
    draft, _ = trained_on(trained_world, ["block_out:1", "block_out:3", "block_out:5"])
    verdict = diagnose(Diagnosis(draft, trained_world.layout, data,
                                 target_head=trained_world.head, steps=STEPS))
    assert verdict.names == ["missing_embedding"], verdict.explain()
    assert verdict.best_layout.names == ["block_out:1", "block_out:3", "block_out:5"]
    assert {r.kind for r in verdict.table} == {"recorded", "missing_embedding", "permuted"}
    assert "no probe set" in verdict.notes[0]


def test_an_inconclusive_verdict_says_what_the_undecided_layouts_cost():
    """Where neighbours fit alike (deep blocks of a real target), INCONCLUSIVE names each
    undecided candidate with its predicted tau beside the recorded layout's: the evidence a
    user weighs (a skew among alike layouts costs that little)."""
    from eyas.doctor.evidence import Comparison, Weighing
    from eyas.doctor.verdict import LayoutRow, Verdict
    from eyas.draft.accuracy import PositionCounts, StepAccuracy
    from eyas.layout import HiddenStateLayout, TargetIdentity

    target = TargetIdentity("LlamaForCausalLM", 30, 64)
    recorded = HiddenStateLayout.from_names(target, ["block_out:1", "block_out:14",
                                                     "block_out:26"])
    near = HiddenStateLayout.from_names(target, ["block_out:1", "block_out:14",
                                                 "block_out:27"])

    def accuracy(*conditional):
        return StepAccuracy([PositionCounts(100, 100, round(100 * c), 100, round(100 * c))
                             for c in conditional], 4)
    other_verifier = HiddenStateLayout(target, recorded.draft_inputs,
                                       HiddenStateLayout.from_names(target, near.names,
                                                                    "final_norm").verifier)
    table = [LayoutRow("recorded", "", recorded, accuracy(0.6, 0.5)),
             LayoutRow("verifier", "", other_verifier, accuracy(0.1, 0.1)),  # same inputs
             LayoutRow("shifted", "", near, accuracy(0.6, 0.45))]
    weighing = Weighing(400, [Comparison(near.names, "shifted", 0.01, 1.2)])
    verdict = Verdict(recorded, recorded, table=table, weighing=weighing)
    assert verdict.status == "INCONCLUSIVE"
    assert ("what they would cost (predicted tau on the probe): recorded 1.90, "
            "['block_out:1', 'block_out:14', 'block_out:27'] 1.87 (-0.03)") in verdict.inconclusive
