"""eyas.draft.eagle3.formats: each format's reader (through eyas.draft.load, the one loader), what
each engine feeds from the config, and the serve stage and export on drafts other tools wrote.
Fixtures are the trained eyas draft rewritten by each tool's schema (tests/foreign_drafts.py
as_eagle3 / as_specforge / as_speculators name the upstream files the schema was read from)."""
from __future__ import annotations

import json

import pytest
import torch
from foreign_drafts import as_eagle3, as_specforge, as_speculators
from safetensors.torch import load_file, save_file

from eyas.config import ServeConfig
from eyas.draft.claims import FormatError
from eyas.doctor.engine import claims_feed as feed
from eyas.draft.load import load, read_claims
from eyas.conventions import UnverifiedVersion
from eyas.serve.export import export_sglang, export_vllm
from eyas.serve.run import DraftRefused, preflight, serve_run
from eyas.targets import identify

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(trained_world):
    return identify(trained_world.target)


def test_each_format_says_what_it_says_and_nothing_more(trained_world, target, tmp_path):
    w = trained_world
    claims = read_claims(w.draft_dir, target)
    assert claims.format == "eyas" and claims.layout.names == w.layout.names
    top = read_claims(as_eagle3(w.draft_dir, tmp_path / "a", top=[0, 2, 4]), target)
    assert top.format == "eagle3" and top.layout.names == w.layout.names
    sf = read_claims(as_specforge(w.draft_dir, tmp_path / "b", [0, 2, 4]), target)
    assert sf.format == "specforge"  # output of layer k: blocks 0, 2, 4 (not vLLM's reading)
    assert sf.layout.names == ["block_out:0", "block_out:2", "block_out:4"]
    sp = read_claims(as_speculators(w.draft_dir, tmp_path / "c", [0, 2, 4], w.embed),
                             target)
    assert sp.format == "speculators" and sp.layout.names == w.layout.names
    none = read_claims(as_eagle3(w.draft_dir, tmp_path / "d"), target)
    assert none.layout is None and "unknown" in none.says  # never the default, guessed


def test_speculators_draft_computes_what_the_eyas_draft_computes(trained_world, target,
                                                                 tmp_path):
    # layers.0.* names, a frozen embed_tokens copy: the same function once read
    w = trained_world
    loaded = load(as_speculators(w.draft_dir, tmp_path / "s", [0, 2, 4], w.embed),
                          w.embed, target)
    ids = torch.randint(0, 300, (2, 9))
    hidden = torch.randn(2, 9, 3 * w.draft_config.target_hidden_size)
    with torch.no_grad():
        want, got = w.draft(ids, hidden)[1], loaded.draft(ids, hidden)[1]
    assert torch.equal(want, got)
    assert loaded.draft.vocab.equals(w.draft.vocab)


def _options_draft(w, out):
    """The trained eyas draft rebuilt with three norm options on (random norm weights, so a
    norm left out or misplaced changes the numbers), saved by eyas."""
    from dataclasses import replace

    from eyas.draft.checkpoint import save_draft
    from eyas.draft.eagle3.model import Eagle3Draft
    options = {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True}
    torch.manual_seed(3)
    d = Eagle3Draft(replace(w.draft.config, **options), w.embed, w.vocab)
    d.load_state_dict(w.draft.state_dict(), strict=False)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    return d, save_draft(d, w.layout, w.vocab, out)


def test_norm_options_are_read_from_each_format_as_the_engine_applies_them(trained_world,
                                                                          target, tmp_path):
    w = trained_world
    original, eyas_dir = _options_draft(w, tmp_path / "eyas")
    ids = torch.randint(0, 300, (2, 9))
    hidden = torch.randn(2, 9, 3 * w.draft_config.target_hidden_size)
    spec = as_speculators(eyas_dir, tmp_path / "s", [0, 2, 4], w.embed)
    for path in (eyas_dir, spec):
        loaded = load(path, w.embed, target)
        with torch.no_grad():
            for want, got in zip(original(ids, hidden), loaded.draft(ids, hidden)):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the same weights read with the options off compute something else
    with torch.no_grad():
        plain = w.draft(ids, hidden)[1]
        assert not torch.allclose(plain, original(ids, hidden)[1])


def test_sglang_versions_that_ignore_an_option_are_named(trained_world, target, tmp_path):
    w = trained_world
    _, eyas_dir = _options_draft(w, tmp_path / "eyas")
    fed = feed(read_claims(eyas_dir, target), target, "sglang", "0.5.23")
    assert any("ignores norm_before_residual" in p for p in fed.problems), fed.problems
    assert not feed(read_claims(w.draft_dir, target), target, "sglang",
                    "0.5.23").problems
    from eyas.conventions import sglang
    assert sglang.ignored_options({"norm_before_fc": True, "norm_output": True},
                                  "0.5.16") == ["norm_before_fc"]
    assert sglang.ignored_options({"norm_before_fc": True, "norm_output": True}, "0.5.17") == []
    from eyas.layout import LayoutError
    with pytest.raises(LayoutError, match="norm_before_residual.*SGLang 0.5.23 ignores"):
        export_sglang(eyas_dir, tmp_path / "sgl", "0.5.23", w.target)


def test_draft_embedding_other_than_the_targets_is_refused(trained_world, target, tmp_path):
    other = trained_world.embed + 1.0
    draft = as_speculators(trained_world.draft_dir, tmp_path / "s", [0, 2, 4], other)
    with pytest.raises(FormatError, match="embed_tokens.weight differs"):
        load(draft, trained_world.embed, target)


def test_norm_before_fc_weights_are_refused_by_name(trained_world, target, tmp_path):
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", top=[0, 2, 4])
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["input_norm.weight"] = torch.ones(3 * trained_world.draft_config.hidden_size)
    save_file(tensors, str(draft / "model.safetensors"))
    with pytest.raises(FormatError, match="norm_before_fc"):
        read_claims(draft, target)


def test_vllm_sizes_fc_from_eagle_config_not_the_top_level_list(trained_world, target,
                                                                tmp_path):
    # two ids under eagle_config: vLLM builds a 2-wide fc for 3-wide weights (load crash)
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", top=[0, 2, 4], nested=[0, 2])
    fed = feed(read_claims(draft, target), target, "vllm")
    assert any("sizes fc for 2 states (the length of eagle_config's list) but the weights' "
               "fc takes 3" in p for p in fed.problems), fed.problems
    ok = feed(read_claims(as_eagle3(trained_world.draft_dir, tmp_path / "e",
                                            top=[0, 2, 4]), target), target, "vllm")
    assert ok.problems == [] and ok.layout.names == trained_world.layout.names


def test_full_vocabulary_draft_with_d2t_is_refused_by_vllm(trained_world, target, tmp_path):
    draft = as_speculators(trained_world.draft_dir, tmp_path / "s", [0, 2, 4],
                           trained_world.embed, full_vocab=True)
    assert feed(read_claims(draft, target), target, "vllm").problems == []
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["d2t"] = torch.zeros(target_vocab := tensors["lm_head.weight"].shape[0],
                                 dtype=torch.int64)
    assert target_vocab == trained_world.draft_config.vocab_size
    save_file(tensors, str(draft / "model.safetensors"))
    fed = feed(read_claims(draft, target), target, "vllm")
    assert any("refuses to load" in p for p in fed.problems)


def test_unverified_engine_versions_are_refused(trained_world, target, tmp_path):
    claims = read_claims(as_specforge(trained_world.draft_dir, tmp_path / "f",
                                              [0, 2, 4]), target)
    with pytest.raises(UnverifiedVersion):
        feed(claims, target, "sglang", "0.4.9")
    with pytest.raises(UnverifiedVersion):
        feed(claims, target, "vllm", "0.9")


def test_export_takes_foreign_drafts_weights_unchanged(trained_world, tmp_path):
    w = trained_world
    draft = as_speculators(w.draft_dir, tmp_path / "s", [0, 2, 4], w.embed)
    out = export_vllm(draft, tmp_path / "vllm", w.target)
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    assert (out / "model.safetensors").read_bytes() == (draft / "model.safetensors").read_bytes()
    sgl = export_sglang(draft, tmp_path / "sglang", "0.5.23", w.target)
    config = json.loads((sgl / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 1, 3]
    assert "eagle_aux_hidden_state_layer_ids" not in config
    assert "layers.0.self_attn.q_proj.weight" not in load_file(str(sgl / "model.safetensors"))
    assert "midlayer.self_attn.q_proj.weight" in load_file(str(sgl / "model.safetensors"))
    with pytest.raises(ValueError, match="eyas doctor data=RUN_DIR/extract .*write_fixed=DIR"):
        export_vllm(as_eagle3(w.draft_dir, tmp_path / "none"), tmp_path / "x", w.target)


def test_evaluate_stage_takes_a_foreign_draft(trained_world, tmp_path):
    from eyas.config import EvalConfig
    from eyas.evaluate.run import evaluate_run
    w = trained_world
    draft = as_speculators(w.draft_dir, tmp_path / "s", [0, 2, 4], w.embed)
    report = evaluate_run(w.data, draft, w.target, EvalConfig(num_prompts=2, max_new_tokens=8),
                          tmp_path / "evaluate", steps=3)
    mine = evaluate_run(w.data, w.draft_dir, w.target,
                        EvalConfig(num_prompts=2, max_new_tokens=8), tmp_path / "evaluate-eyas",
                        steps=3)
    # the same weights read through the speculators schema: the same accuracies
    assert report["per_position_accuracy"] == mine["per_position_accuracy"]
    assert report["measured_tau"] == mine["measured_tau"]


def test_serve_refuses_a_zero_d2t_before_any_engine(trained_world, tmp_path):
    w = trained_world
    draft = as_eagle3(w.draft_dir, tmp_path / "d", top=[0, 2, 4], nested=[0, 2, 4])
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["d2t"] = torch.zeros_like(tensors["d2t"])
    save_file(tensors, str(draft / "model.safetensors"))
    cfg = ServeConfig(engine="reference", num_prompts=1, max_new_tokens=4)
    with pytest.raises(DraftRefused, match="d2t_identity"):
        serve_run(w.target, draft, w.data, cfg, tmp_path / "serve")
    report = json.loads((tmp_path / "serve" / "report.json").read_text())
    assert [f["name"] for f in report["doctor"]["findings"]] == ["d2t_identity"]
    assert "tau" not in report  # nothing benchmarked


def test_serve_refuses_weights_that_fit_other_slots_before_any_engine(trained_world, tmp_path):
    """The seeds' mistake: weights trained on each slot one block later than the config
    records. Config and data agree, so only the weights' evidence tells; serve refuses the
    draft with the doctor's finding before any engine boots."""
    from eyas.draft.checkpoint import save_draft
    from world import trained_on_slots

    w = trained_world
    draft, _ = trained_on_slots(w, ["block_out:0", "block_out:2", "block_out:4"])
    mislabelled = tmp_path / "d"
    save_draft(draft, w.layout, draft.vocab, mislabelled)  # records embed, block 1, block 3
    cfg = ServeConfig(engine="reference", num_prompts=1, max_new_tokens=4)
    with pytest.raises(DraftRefused, match=r"shifted: the draft's weights fit \[block 0, "
                                           r"block 2, block 4\].*beyond doubt"):
        serve_run(w.target, mislabelled, w.data, cfg, tmp_path / "serve")
    report = json.loads((tmp_path / "serve" / "report.json").read_text())
    assert [f["name"] for f in report["doctor"]["findings"]] == ["shifted"]
    assert "tau" not in report  # nothing benchmarked


def test_serve_and_doctor_agree_on_top_level_only_ids(trained_world, tmp_path, capsys):
    from workflows import doctor

    w = trained_world
    draft = as_eagle3(w.draft_dir, tmp_path / "d", top=[0, 2, 4])  # right on vLLM 0.32
    assert preflight(w.target, draft, w.data, "vllm")["findings"] == []
    assert doctor.main(["--data", str(w.data), "--draft", str(draft), "--target",
                        str(w.target), "--engine", "vllm"]) != doctor.FAULT
    assert "engine: OK" in capsys.readouterr().out
    shifted = as_eagle3(w.draft_dir, tmp_path / "s", top=[0, 2, 4], nested=[0, 2])
    found = preflight(w.target, shifted, w.data, "vllm")["findings"]
    assert [f.name for f in found] == ["engine_feed"]
    assert doctor.main(["--data", str(w.data), "--draft", str(shifted), "--target",
                        str(w.target), "--engine", "vllm"]) == doctor.FAULT
    capsys.readouterr()


@pytest.mark.speculators
def test_speculators_own_loader_reads_the_fixture(trained_world, tmp_path):
    """The speculators fixture is what speculators itself loads (pip install --no-deps
    speculators, plus its `datasets` import); skipped where it is not installed."""
    eagle3 = pytest.importorskip("speculators.models.eagle3")
    w = trained_world
    draft = as_speculators(w.draft_dir, tmp_path / "s", [0, 2, 4], w.embed,
                           verifier=str(w.target))
    model = eagle3.Eagle3DraftModel.from_pretrained(str(draft))
    assert list(model.config.eagle_aux_hidden_state_layer_ids) == [0, 2, 4]
    assert torch.equal(model.state_dict()["fc.weight"], w.draft.fc.weight.detach())


def test_mla_draft_is_read_as_deepseek_eagle3_and_computes_what_was_written(trained_world,
                                                                           target, tmp_path):
    """vLLM's MLA draft schema (tests/foreign_drafts.py as_mla): the reader rebuilds the same
    function (same outputs), and a config lacking an MLA key or weights of the wrong shape
    are refused naming them."""
    import dataclasses
    from types import SimpleNamespace

    from eyas.draft.eagle3.model import Eagle3Draft
    from foreign_drafts import WORLD_MLA, as_mla

    w = trained_world
    config = dataclasses.replace(w.draft_config, mla=dict(WORLD_MLA), num_key_value_heads=4,
                                 head_dim=WORLD_MLA["qk_rope_head_dim"])
    torch.manual_seed(1)
    draft = Eagle3Draft(config, w.embed, w.vocab).eval()
    mla = SimpleNamespace(config=config, tensors={k: v for k, v in draft.state_dict().items()
                                                  if k != "embed_tokens.weight"})
    loaded = load(as_mla(mla, tmp_path / "m", ids=[0, 2, 4]), w.embed, target)
    assert loaded.claims.format == "eagle3-mla" and loaded.claims.layout.names == w.layout.names
    ids, hidden = torch.randint(0, 60, (2, 12)), torch.randn(2, 12, 3 * 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.draft(ids, hidden)[1], draft(ids, hidden)[1])
    bad = as_mla(mla, tmp_path / "k", ids=[0, 2, 4])
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["kv_lora_rank"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"lacks \['kv_lora_rank'\]"):
        read_claims(bad, target)
    wrong = as_mla(SimpleNamespace(config=config, tensors={
        **mla.tensors, "midlayer.self_attn.kv_b_proj.weight": torch.zeros(4 * 16, 8)}),
        tmp_path / "w", ids=[0, 2, 4])
    with pytest.raises(FormatError, match=r"wrong shapes \['midlayer.self_attn.kv_b_proj"):
        read_claims(wrong, target)


def test_eagles_own_template_is_read_as_vllm_serves_it(trained_world, target, tmp_path):
    """EAGLE's training template (SafeAILab/EAGLE eagle/traineagle3/config.json) names the draft
    `LlamaForCausalLM`, one layer, with a draft vocabulary; vLLM serves it as its EAGLE-3 draft
    under method eagle3. A full Llama model of one layer is not mistaken for one."""
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", top=[0, 2, 4], nested=[0, 2, 4])
    config = json.loads((draft / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (draft / "config.json").write_text(json.dumps(config))
    claims = read_claims(draft, target)
    assert claims.format == "eagle3" and claims.layout.names == trained_world.layout.names
    del config["draft_vocab_size"]
    (draft / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match="not an EAGLE-3 draft format"):
        read_claims(draft, target)
