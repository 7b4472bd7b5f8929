"""The layout contract: slot tensors, compilers, inverse parsers and the errors at its edges."""
import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eyas.conventions import hf, sglang, specforge, vllm
from eyas.layout import (EMBED, FINAL_NORM, HiddenStateLayout, LayoutError, Slot, SlotNorms,
                         TargetIdentity, default_layout, layout_from_config)

LLAMA60 = TargetIdentity("LlamaForCausalLM", 60, 7168, "w", "t", "c")
KIMI60 = TargetIdentity("DeepseekV3ForCausalLM", 60, 7168, "w", "t", "c")
SEEDS = ["embed", "block_out:2", "block_out:30"]


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=5, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    ident = TargetIdentity("LlamaForCausalLM", 5, 32)
    return model, ident


def test_slot_tensors_equal_hf_at_compiled_indices(tiny_llama):
    model, ident = tiny_llama
    ids = torch.randint(0, 128, (2, 9))
    slots = [EMBED, Slot("block_out", 0), Slot("block_out", 2), Slot("block_out", 3), FINAL_NORM]
    got = hf.capture(model, ids, slots)
    reported = model(ids, output_hidden_states=True).hidden_states
    for slot, index in zip(slots, hf.to_indices(slots, ident)):
        torch.testing.assert_close(got[slot], reported[index], rtol=0, atol=0)
    assert hf.to_indices(slots, ident) == [0, 1, 3, 4, 5]


def test_prenorm_last_slot_differs_from_hf_postnorm(tiny_llama):
    model, ident = tiny_llama
    ids = torch.randint(0, 128, (1, 9))
    last = Slot.parse("final_prenorm", 5)
    assert last == Slot("block_out", 4)
    got = hf.capture(model, ids, [last, FINAL_NORM])
    post = model(ids, output_hidden_states=True).hidden_states[5]
    assert (got[last] - post).abs().max() > 0.1  # HF's last index is after the norm
    torch.testing.assert_close(got[FINAL_NORM], post)
    torch.testing.assert_close(model.model.norm(got[last]), post)
    with pytest.raises(LayoutError, match="after the final norm"):
        hf.to_indices([last], ident)


def test_seeds_case_compiles_to_each_engine():
    layout = HiddenStateLayout.from_names(LLAMA60, SEEDS)
    assert vllm.to_ids(layout) == [0, 3, 31]
    assert sglang.to_ids(layout) == [-1, 2, 30]
    assert hf.to_indices(layout.draft_inputs, layout.target) == [0, 3, 31]
    kimi = HiddenStateLayout.from_names(KIMI60, SEEDS)
    assert sglang.to_ids(kimi, "0.5.23") == [0, 3, 31]  # first id 0 -> used raw
    with pytest.raises(LayoutError, match="embedding"):
        sglang.to_ids(kimi, "0.5.12")  # always +1: the embedding can't be named
    with pytest.raises(LayoutError, match="id 0 .the embedding. crashes"):
        vllm.to_ids(kimi)
    # What the story's engine fed: [3, 31, 59] is every slot shifted by one block.
    served = vllm.from_ids([3, 31, 59], LLAMA60)
    assert served.names == ["block_out:2", "block_out:30", "block_out:58"]
    assert served.draft_inputs != layout.draft_inputs


def test_default_layout_is_vllms_default_and_refuses_collapse():
    layout = default_layout(LLAMA60)
    assert layout.names == ["block_out:1", "block_out:29", "block_out:56"]
    assert vllm.to_ids(layout) == [2, 30, 57]
    assert vllm.from_ids(None, LLAMA60) == layout
    assert layout.verifier == Slot("block_out", 59)
    for n in (4, 5, 6):
        with pytest.raises(LayoutError, match=f"target has {n} decoder blocks.*collapse"):
            default_layout(TargetIdentity("LlamaForCausalLM", n, 64))
    assert default_layout(TargetIdentity("LlamaForCausalLM", 8, 64)).names == [
        "block_out:1", "block_out:3", "block_out:4"]


def test_a_configs_slot_names_or_null_make_the_layout():
    assert layout_from_config(LLAMA60, None) == default_layout(LLAMA60)
    assert layout_from_config(LLAMA60, SEEDS, "final_norm") == \
        HiddenStateLayout.from_names(LLAMA60, SEEDS, "final_norm")
    assert layout_from_config(LLAMA60, None, "block_out:58").verifier == Slot("block_out", 58)


@pytest.mark.parametrize("names", [SEEDS, ["block_out:1", "block_out:29", "block_out:56"],
                                   ["embed", "block_out:58"], ["block_out:3"]])
def test_compilers_round_trip(names):
    layout = HiddenStateLayout.from_names(LLAMA60, names)
    assert vllm.from_ids(vllm.to_ids(layout), LLAMA60) == layout
    assert sglang.from_ids(sglang.to_ids(layout), LLAMA60) == layout
    assert hf.from_indices(hf.to_indices(layout.draft_inputs, layout.target), LLAMA60) == layout.draft_inputs
    kimi = HiddenStateLayout.from_names(KIMI60, names)
    assert sglang.from_ids(sglang.to_ids(kimi, "0.5.23"), KIMI60, "0.5.23") == kimi
    if "embed" not in names:
        assert sglang.from_ids(sglang.to_ids(kimi, "0.5.12"), KIMI60, "0.5.12") == kimi
        assert specforge.from_ids(specforge.to_ids(layout), LLAMA60) == layout
        assert vllm.from_ids(vllm.to_ids(kimi), KIMI60) == kimi


def test_deepseek_sglang_first_id_one_rule():
    # raw id 1 (= block_out:0 first) would be read as "output of layer 1": refused
    with pytest.raises(LayoutError, match="inexpressible"):
        sglang.to_ids(HiddenStateLayout.from_names(KIMI60, ["block_out:0", "block_out:5"]))
    # ids beginning with 1 are read the +1 way
    assert sglang.from_ids([1, 20, 40], KIMI60).names == ["block_out:1", "block_out:20",
                                                           "block_out:40"]
    assert sglang.from_ids([2, 20, 40], KIMI60).names == ["block_out:1", "block_out:19",
                                                           "block_out:39"]


def test_engine_limits_are_refused_with_reasons():
    last = HiddenStateLayout.from_names(LLAMA60, ["block_out:2", "block_out:59"])
    assert vllm.to_ids(last) == [3, 60]
    with pytest.raises(LayoutError, match="never captures block_out:59"):
        sglang.to_ids(last)
    with pytest.raises(LayoutError, match="ascending"):
        vllm.to_ids(HiddenStateLayout.from_names(LLAMA60, ["block_out:30", "block_out:2"]))
    with pytest.raises(LayoutError, match="SpecForge.*embed"):
        specforge.to_ids(HiddenStateLayout.from_names(LLAMA60, SEEDS))
    with pytest.raises(LayoutError, match="not been verified"):
        vllm.to_ids(HiddenStateLayout.from_names(LLAMA60, SEEDS), "0.99.0")
    with pytest.raises(LayoutError, match="no EAGLE-3 interface for it"):
        vllm.to_ids(HiddenStateLayout.from_names(TargetIdentity("GPT2LMHeadModel", 48, 768),
                                                 SEEDS))
    with pytest.raises(LayoutError, match="refusing to guess"):
        sglang.to_ids(HiddenStateLayout.from_names(TargetIdentity("Olmo2ForCausalLM", 32, 4096),
                                                   ["block_out:2", "block_out:15"]))
    with pytest.raises(LayoutError, match="never reached"):
        sglang.from_ids([2, 30, 59], LLAMA60)  # 59 + 1 = 60: silently not captured


def test_sglang_versions_are_checked_for_llama_too():
    layout = HiddenStateLayout.from_names(LLAMA60, SEEDS)
    assert sglang.to_ids(layout, "0.5.23") == [-1, 2, 30]
    for unread in ("0.6.0", "0.5.22", "0.4.9"):
        with pytest.raises(LayoutError, match=rf"SGLang {unread}: its Llama-family capture rule "
                                              r"has not been verified \(verified: 0.5.23\)"):
            sglang.to_ids(layout, unread)
        with pytest.raises(LayoutError, match="not been verified"):
            sglang.from_ids([-1, 2, 30], LLAMA60, unread)


def test_vllm_deepseek_ids_are_ascending_or_refused():
    # DeepSeek keeps the ids unsorted but captures each as its layer runs: concat is ascending
    assert vllm.to_ids(HiddenStateLayout.from_names(KIMI60, ["block_out:2", "block_out:30"])) \
        == [3, 31]
    descending = HiddenStateLayout.from_names(KIMI60, ["block_out:30", "block_out:2"])
    with pytest.raises(LayoutError, match=r"DeepseekV3ForCausalLM.*loop over layers.*"
                                          r"\['block_out:2', 'block_out:30'\]"):
        vllm.to_ids(descending)
    assert vllm.from_ids([31, 3], KIMI60).names == ["block_out:2", "block_out:30"]


def test_bad_slots_name_the_slot_and_layer_count():
    with pytest.raises(LayoutError, match=r"block_out:60 is out of range: the target has 60"):
        HiddenStateLayout.from_names(LLAMA60, ["embed", "block_out:60"])
    with pytest.raises(LayoutError, match=r"block_out:2 appears twice.*60 decoder blocks"):
        HiddenStateLayout.from_names(LLAMA60, ["block_out:2", "embed", "block_out:2"])
    with pytest.raises(LayoutError, match=r"block_out:59 appears twice"):
        HiddenStateLayout.from_names(LLAMA60, ["final_prenorm", "block_out:59"])
    with pytest.raises(LayoutError, match="unknown hidden-state slot 'layer3'"):
        HiddenStateLayout.from_names(LLAMA60, ["layer3"])
    layout = HiddenStateLayout.from_names(LLAMA60, SEEDS)
    with pytest.raises(LayoutError, match=r"expects 4 hidden-state slots.*has 3.*60 decoder"):
        layout.expect_draft_inputs(4)
    layout.expect_draft_inputs(3)


def test_json_round_trip_keeps_norms_and_identity():
    layout = HiddenStateLayout.from_names(LLAMA60, SEEDS).with_norms(
        {"embed": SlotNorms(1.04, 0.1), "block_out:2": SlotNorms(37.17, 3.0)})
    back = HiddenStateLayout.from_json(layout.to_json())
    assert back == layout and back.norms == layout.norms
    assert back.target.fingerprint == LLAMA60.fingerprint


def test_check_matches_names_both_sides():
    a = HiddenStateLayout.from_names(LLAMA60, SEEDS)
    b = HiddenStateLayout.from_names(LLAMA60, ["block_out:2", "block_out:30", "block_out:58"])
    with pytest.raises(LayoutError, match=r"draft.*does not match dataset.*\['embed'"):
        a.check_matches(b, "draft", "dataset")
    other_rev = TargetIdentity("LlamaForCausalLM", 60, 7168, "w2", "t", "c")
    with pytest.raises(LayoutError, match=r"weights: 'w' vs 'w2'"):
        a.check_matches(HiddenStateLayout.from_names(other_rev, SEEDS), "draft", "dataset")
    a.check_matches(HiddenStateLayout.from_names(LLAMA60, SEEDS), "draft", "dataset")


def test_every_configured_engine_has_rules_and_others_are_named():
    from eyas.config import ExtractConfig, ServeConfig
    from eyas.conventions.engines import engine_rules

    for name in ("vllm", "reference", "hf", "sglang"):
        assert engine_rules(name).name == name
    assert engine_rules("vllm").ids is vllm and engine_rules("sglang").ids is sglang
    assert engine_rules(ServeConfig().engine).boots_vllm
    assert not engine_rules(ExtractConfig().backend).shards_target
    with pytest.raises(ValueError, match="engine 'tgi': one of hf, vllm, reference, sglang"):
        engine_rules("tgi")
    # the config's choices are the registry's: an engine serves or extracts by its rules
    from workflows.config import registered_choices
    for config, key, rule in ((ServeConfig, "engine", "serves"),
                              (ExtractConfig, "backend", "extracts")):
        field = next(f for f in dataclasses.fields(config) if f.name == key)
        assert set(registered_choices(field)) == {
            name for name in ("vllm", "reference", "hf", "sglang")
            if getattr(engine_rules(name), rule)}


@pytest.mark.specforge
@pytest.mark.parametrize("num_layers", [8, 24, 28, 30, 36, 64])
def test_spread_slots_are_the_layers_specforges_dflash_reads(num_layers):
    """extract.layout.spread=n feeds a DFlash draft the layer outputs SpecForge's DFlash of n
    layers reads (its build_target_layer_ids), and the draft's written ids say so."""
    build_target_layer_ids = pytest.importorskip(
        "specforge.modeling.draft.dflash").build_target_layer_ids
    from eyas.conventions import vllm_dflash

    target = TargetIdentity("LlamaForCausalLM", num_layers, 64)
    for n in range(1, 7):
        want = build_target_layer_ids(num_layers, n)
        if len(set(want)) < n:  # a target too shallow to spread n: refused, never collapsed
            with pytest.raises(LayoutError, match="not .* distinct ones"):
                layout_from_config(target, None, spread=n)
            continue
        layout = layout_from_config(target, None, spread=n)
        assert vllm_dflash.to_layer_ids(layout) == want


def test_spread_and_named_slots_are_one_or_the_other():
    with pytest.raises(LayoutError, match="both name the slots"):
        layout_from_config(LLAMA60, SEEDS, spread=3)
    with pytest.raises(LayoutError, match="at least 1"):
        layout_from_config(LLAMA60, None, spread=0)


def test_preflight_refuses_a_spread_the_target_is_too_shallow_for():
    from workflows.config import ConfigError, load_config
    from workflows.plan import preflight

    cfg = load_config(["extract.layout.draft_inputs=null", "extract.layout.spread=3"])
    with pytest.raises(ConfigError, match="4 decoder blocks: 3 slots spread .* not 3 distinct"):
        preflight(cfg)
    plan = preflight(load_config(["extract.layout.draft_inputs=null", "extract.layout.spread=1"]))
    assert plan.layout.names == ["block_out:2"]  # SpecForge's one-layer DFlash: block N//2
