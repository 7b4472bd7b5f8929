"""Loaded-weights parity without an engine: vLLM's naming of a draft's tensors (the fused
projections, the renamed and skipped ones, the tied head) and the comparison that names each
tensor the drafter holds otherwise than the file; the static traps read from a draft
directory (a zeroed tensor, a rotary range shorter than the served length); and the served
draft that contributes nothing."""
import json
import shutil

import pytest
import torch

from eyas.conventions.vllm_weights import expected_held, held_name, unread
from eyas.serve.loaded import compare_tensors, weights_findings


def test_held_names_follow_vllms_loader():
    assert held_name("midlayer.self_attn.k_proj.weight") == (
        "model.layers.0.self_attn.qkv_proj.weight", 1)
    assert held_name("layers.2.mlp.up_proj.weight") == ("model.layers.2.mlp.gate_up_proj.weight",
                                                        1)
    assert held_name("fc.weight") == ("model.fc.weight", None)
    assert held_name("lm_head.weight") == ("lm_head.weight", None)
    assert held_name("d2t") == ("draft_id_to_target_id", None)
    assert held_name("t2d") is None
    assert unread("model.layers.1.hidden_norm.weight")
    assert not unread("model.layers.0.hidden_norm.weight")


def _file(g):
    return {"midlayer.self_attn.q_proj.weight": torch.randn(8, 4, generator=g),
            "midlayer.self_attn.k_proj.weight": torch.randn(2, 4, generator=g),
            "midlayer.self_attn.v_proj.weight": torch.randn(2, 4, generator=g),
            "norm.weight": torch.rand(4, generator=g) + 0.5,
            "d2t": torch.tensor([0, 1, 1]), "t2d": torch.ones(6, dtype=torch.bool)}


def _held(expected):
    return {name: e.tensor.clone() for name, e in expected.items()}


def test_fused_rows_stack_in_vllms_order_and_a_tied_head_is_the_embeddings_rows():
    g = torch.Generator().manual_seed(0)
    file, embed = _file(g), torch.randn(6, 4, generator=g)
    expected = expected_held(file, {"tie_word_embeddings": True}, embed, torch.tensor([0, 2, 3]))
    qkv = expected["model.layers.0.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv.tensor[8:10], file["midlayer.self_attn.k_proj.weight"])
    assert qkv.sources[0].endswith("q_proj.weight")
    assert torch.equal(expected["lm_head.weight"].tensor, embed[[0, 2, 3]])
    assert "t2d" not in str([e.sources for e in expected.values()])
    untied = expected_held(file, {}, embed, None)
    assert "lm_head.weight" not in untied  # nothing to hold it to: vLLM's is reported


@pytest.mark.parametrize("damage,status", [
    (lambda h: h.pop("model.norm.weight"), "missing"),
    (lambda h: h["model.norm.weight"].zero_(), "zeroed"),
    (lambda h: h["model.layers.0.self_attn.qkv_proj.weight"].mul_(1.1), "differs"),
    (lambda h: h.update({"draft_id_to_target_id": torch.tensor([0, 1, 2])}), "differs"),
    (lambda h: h.update({"lm_head.weight": torch.zeros(9, 4)}), "not_loaded"),
    (lambda h: h.update({"model.norm.weight": torch.ones(5)}), "shape"),
])
def test_each_damage_to_the_held_tensors_names_the_tensor(damage, status):
    g = torch.Generator().manual_seed(1)
    expected = expected_held(_file(g), {}, torch.randn(6, 4, generator=g), None)
    held = _held(expected)
    assert {r.status for r in compare_tensors(expected, held, torch.float32)} == {"equal"}
    damage(held)
    rows = compare_tensors(expected, held, torch.float32)
    bad = [r for r in rows if r.status != "equal"]
    assert [r.status for r in bad] == [status]
    (finding,) = weights_findings(rows)
    assert finding.name == f"weights_{status}" and bad[0].name in finding.message


def test_held_in_the_engines_dtype_is_equal_and_unread_tensors_are_not_reported():
    g = torch.Generator().manual_seed(2)
    expected = expected_held(_file(g), {}, torch.randn(6, 4, generator=g), None)
    held = {n: (t.to(torch.bfloat16) if t.is_floating_point() else t)
            for n, t in _held(expected).items()}
    held["model.layers.1.hidden_norm.weight"] = torch.ones(4)  # only layer 0's is read
    rows = compare_tensors(expected, held, torch.bfloat16)
    assert {r.status for r in rows} == {"equal"}
    assert all(r.checksum == r.held_checksum for r in rows)


def _draft(tmp_path, trained_world):
    d = tmp_path / "d"
    shutil.copytree(trained_world.draft_dir, d)
    return d


def test_a_zeroed_tensor_in_the_file_is_a_finding(trained_world, tmp_path):
    from safetensors.torch import load_file, save_file

    from eyas.doctor.static import zeroed_tensors

    d = _draft(tmp_path, trained_world)
    assert zeroed_tensors(d) == []
    w = load_file(d / "model.safetensors")
    name = next(n for n in w if n.endswith("down_proj.weight"))
    w[name].zero_()
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    (finding,) = zeroed_tensors(d)
    assert finding.name == "zeroed_tensor" and name in finding.message


def test_a_rotary_range_shorter_than_the_served_length_is_a_finding(trained_world, tmp_path):
    from eyas.doctor.static import positions_finding
    from eyas.conventions.kinds import KINDS

    d = _draft(tmp_path, trained_world)
    config = json.loads((d / "config.json").read_text())
    positions = config["max_position_embeddings"]
    assert positions_finding(config, d, positions, KINDS["eagle3"], "served") == []
    (finding,) = positions_finding(config, d, positions + 1, KINDS["eagle3"], "served")
    assert finding.name == "short_positions" and f"at least {positions + 1}" in finding.message


def test_a_draft_accepted_at_no_position_contributes_nothing():
    from eyas.serve.report import ServeBenchmark, ServeReport
    from eyas.serve.run import contributes_nothing

    def report(tau, first):
        bench = ServeBenchmark("vllm", 8, 3, 32, tau, [first, first / 2, 0.0], {}, 1.0, 1.0,
                               1.0, 1.0, 1.0, 1.0, True)
        return ServeReport("vllm", "d", True, {}, False, "d",
                           {"weights": {"ok": True}}, bench)
    (finding,) = contributes_nothing(report(1.0, 0.0))
    assert finding.name == "contributes_nothing" and "were proven equal" in finding.message
    assert contributes_nothing(report(1.6, 0.55)) == []
    assert contributes_nothing(report(1.01, 0.05))  # tau alone
