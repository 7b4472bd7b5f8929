"""The config-only doctor from the command line: a target given as its config.json alone, any
draft family, the verdict as JSON for CI; norm options checked per trainer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from eyas.doctor.static import examine
from workflows.doctor import main

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "data" / "published_drafts"


def _dirs(tmp_path, draft: str, target: str, edit=None) -> tuple[Path, Path]:
    d, t = tmp_path / "draft", tmp_path / "target"
    d.mkdir()
    t.mkdir()
    config = json.loads((CORPUS / draft).read_text())
    if edit:
        edit(config)
    (d / "config.json").write_text(json.dumps(config))
    shutil.copy(CORPUS / "targets" / target, t / "config.json")
    return d, t


def test_a_61_layer_target_from_its_config_alone(tmp_path, capsys):
    draft, target = _dirs(tmp_path, "specforge__deepseek-v3-671b-eagle3.json",
                          "deepseek-ai__DeepSeek-V3.json")
    assert main(["--draft", str(draft), "--target", str(target), "--json", "-"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["target"]["num_layers"] == 61 and out["family"] == "eagle3"
    by = {e["id"]: e for e in out["engines"]}
    assert by["vllm:0.32:v1"]["key"] == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert by["vllm:0.32:v1"]["capture_indices"] == [1, 29, 57]
    assert by["vllm:0.32:v2"]["key"] is None and by["vllm:0.32:v2"]["slots"] == [
        "block_out:1", "block_out:29", "block_out:57"]
    assert by["vllm:0.32:v2"]["hf_hidden_states"] == [2, 30, 58]
    names = [f["name"] for f in out["findings"]]
    assert "runners_disagree" in names and all(f["message"] for f in out["findings"])


def test_ids_written_at_the_top_level_too_make_both_runners_agree(tmp_path, capsys):
    def fixed(config):  # what the finding says to write: the trained slots, vLLM ids
        config["eagle_aux_hidden_state_layer_ids"] = [2, 30, 58]
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 30, 58]
    draft, target = _dirs(tmp_path, "specforge__deepseek-v3-671b-eagle3.json",
                          "deepseek-ai__DeepSeek-V3.json", fixed)
    assert main(["--draft", str(draft), "--target", str(target)]) == 0
    assert "skew doctor (config only): OK" in capsys.readouterr().out


def test_a_multimodal_target_is_read_through_its_text_config(tmp_path, capsys):
    draft, target = _dirs(tmp_path, "specforge__qwen2-5-vl-7b-eagle3.json",
                          "Qwen__Qwen2.5-VL-7B-Instruct.json")
    code = main(["--draft", str(draft), "--target", str(target)])
    text = capsys.readouterr().out
    assert "Qwen2_5_VLForConditionalGeneration, 28 layers" in text and "not a causal LM" not in text
    assert code == 3  # no ids: which slots it was trained on is for the weights to say


def test_an_eyas_draft_whose_config_lost_a_norm_option_is_a_fault(tmp_path):
    def eyas_draft(config):
        config["eyas_layout"] = {"draft_inputs": ["block_out:1", "block_out:15", "block_out:28"]}
        config["eyas_model_args"] = {"norm_before_residual": True}
        config["norm_before_residual"] = False  # lost: vLLM then applies none
        config["eagle_aux_hidden_state_layer_ids"] = [2, 16, 29]
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    draft, target = _dirs(tmp_path, "specforge__llama3-8B-eagle3.json",
                          "meta-llama__Llama-3.1-8B-Instruct.json", eyas_draft)
    v = examine(draft, target)
    assert [f.name for f in v.findings] == ["norm_options"]
    assert "norm_before_residual" in v.findings[0].message
    # SGLang reads eagle_config's ids in its own convention: said when it is the engine asked
    assert "engine_feed" in [f.name for f in examine(draft, target, engine="sglang").findings]


def test_specforge_norm_output_is_flagged_for_its_older_meaning(tmp_path):
    draft, target = _dirs(tmp_path, "specforge__qwen3-30B-A3B-eagle3.1.json",
                          "Qwen__Qwen3-30B-A3B.json")
    assert "norm_options" not in [f.name for f in examine(draft, target).findings]
    said = examine(draft, target, trainer="specforge").findings
    assert any(f.name == "norm_options" and "#879" in f.message for f in said)


def test_weight_shapes_come_from_the_header_alone(tmp_path):
    """A draft's tensor names and shapes are read from the safetensors header: a file whose
    data is cut short (as if only its first kilobytes had been downloaded) still answers."""
    import torch
    from safetensors.torch import save_file

    from eyas.draft.weights import tensor_shapes

    save_file({"fc.weight": torch.zeros(64, 3 * 128), "lm_head.weight": torch.zeros(100, 64)},
              str(tmp_path / "model.safetensors"))
    whole = (tmp_path / "model.safetensors").read_bytes()
    header = 8 + int.from_bytes(whole[:8], "little")
    (tmp_path / "model.safetensors").write_bytes(whole[:header + 16])  # the data cut short
    assert tensor_shapes(tmp_path) == {"fc.weight": (64, 384), "lm_head.weight": (100, 64)}


def test_the_device_says_which_runner_is_held_to_the_config(tmp_path, capsys):
    draft, target = _dirs(tmp_path, "specforge__deepseek-v3-671b-eagle3.json",
                          "deepseek-ai__DeepSeek-V3.json")
    # on a GPU the V2 runner feeds the default, which is what SpecForge trained on
    assert main(["--draft", str(draft), "--target", str(target), "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "assumed: vLLM 0.32 V2 runner" in out
    # on the CPU build the V1 runner reads eagle_config's ids as inputs of layers: one off
    assert main(["--draft", str(draft), "--target", str(target), "--device", "cpu"]) == 1
    assert "assumed: vLLM 0.32 V1 runner" in capsys.readouterr().out


def test_a_parallel_draft_without_its_mask_is_not_served(tmp_path):
    """vLLM reads a parallel drafter's mask token id from one of five keys and refuses to
    boot without one; P-EAGLE's weights must carry mask_hidden. A DFlash block is served as
    block_size - 1 drafts."""
    from safetensors.torch import save_file
    import torch

    def strip(config):
        config["dflash_config"].pop("mask_token_id", None)
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-dflash.json", "Qwen__Qwen3-8B.json")
    config = json.loads((draft / "config.json").read_text())
    verdict = examine(draft, target)
    assert "mask_id" not in [f.name for f in verdict.findings]
    assert any(f"num_speculative_tokens = {config['block_size'] - 1}" in n
               for n in verdict.notes)
    shutil.rmtree(tmp_path / "draft")
    shutil.rmtree(tmp_path / "target")
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-dflash.json", "Qwen__Qwen3-8B.json",
                          strip)
    assert "mask_id" in [f.name for f in examine(draft, target).findings]

    peagle = tmp_path / "peagle"
    peagle.mkdir()
    config = {"architectures": ["LlamaForCausalLMEagle3"], "eyas_family": "peagle",
              "mask_token_id": 151643, "eagle_aux_hidden_state_layer_ids": [2, 18, 33],
              "hidden_size": 4096, "vocab_size": 151936, "draft_vocab_size": 32000}
    (peagle / "config.json").write_text(json.dumps(config))
    save_file({"fc.weight": torch.zeros(4, 3 * 4096)}, str(peagle / "model.safetensors"))
    assert [f.name for f in examine(peagle, target).findings
            if f.name.startswith("mask")] == ["mask_hidden"]
    save_file({"fc.weight": torch.zeros(4, 3 * 4096), "mask_hidden": torch.zeros(3 * 4096)},
              str(peagle / "model.safetensors"))
    assert not [f for f in examine(peagle, target).findings if f.name.startswith("mask")]


def test_a_negative_id_is_refused_naming_the_file_the_key_and_the_value(tmp_path, capsys):
    def negative(config):
        config["eagle_aux_hidden_state_layer_ids"] = [-2, 17, 33]
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-eagle3.json", "Qwen__Qwen3-8B.json",
                          negative)
    assert main(["--draft", str(draft), "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert (f"{draft / 'config.json'}: eagle_aux_hidden_state_layer_ids = [-2, 17, 33]: -2 is "
            "not a layer of the target") in err
    assert "block_out:-3" not in err  # not the slot a -2 would wrongly become


def test_a_target_config_that_is_not_json_is_named(tmp_path, capsys):
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-eagle3.json", "Qwen__Qwen3-8B.json")
    (target / "config.json").write_text("{not json")
    assert main(["--draft", str(draft), "--target", str(target)]) == 2
    assert f"{target / 'config.json'}: not JSON" in capsys.readouterr().err


def test_a_symbolic_link_loop_is_called_a_loop_not_missing(tmp_path, capsys):
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-eagle3.json", "Qwen__Qwen3-8B.json")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert main(["--draft", str(tmp_path / "a"), "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link that loops" in err and "no such file" not in err
    (draft / "config.json").unlink()
    (draft / "config.json").symlink_to(tmp_path / "a")  # the draft's own config a loop
    assert main(["--draft", str(draft), "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"{draft / 'config.json'}: a symbolic link that loops" in err


def test_with_json_to_standard_output_a_refusal_is_json_too(tmp_path, capsys):
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-eagle3.json", "Qwen__Qwen3-8B.json")
    (target / "config.json").write_text("[]")
    assert main(["--draft", str(draft), "--target", str(target), "--json", "-"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "BAD_INPUT" and out["exit_code"] == 2
    assert str(target / "config.json") in out["error"]
    assert main(["--draft", str(tmp_path / "nowhere"), "--target", str(target),
                 "--json", "-"]) == 2
    assert "no such file or directory" in json.loads(capsys.readouterr().out)["error"]


def test_a_specforge_peagle_is_refused_for_the_rename_not_a_missing_class(tmp_path):
    """vLLM's registry holds PEagleDraftModel; method eagle3, which serves P-EAGLE, asks it for
    Eagle3PEagleDraftModel instead (transformers_utils/configs/eagle.py)."""
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-peagle.json", "Qwen__Qwen3-8B.json")
    verdict = examine(draft, target)
    refusal = next(f for f in verdict.findings if f.name == "not_served").message
    assert "to ['Eagle3PEagleDraftModel']" in refusal
    assert "it holds PEagleDraftModel itself" in refusal and "has no PEagleDraftModel" not in refusal


def test_a_dflash_config_without_ids_has_fc_sized_by_its_own_layers(tmp_path):
    """vLLM sizes a DFlash draft's fc for its V2 ids, else for the draft's num_hidden_layers
    (qwen3_dflash.py `_get_dflash_fc_input_size`): TorchSpec's 5-layer draft without ids gets
    an fc for 5 states while the runners capture their default 3, and crashes."""
    def no_ids(config):
        del config["target_layer_ids"]
    draft, target = _dirs(tmp_path, "torchspec__dflash_draft_config.json", "Qwen__Qwen3-8B.json",
                          no_ids)
    verdict = examine(draft, target)
    feeds = {f.runner.id: f for f in verdict.runners}
    assert feeds["vllm:0.32:v1"].fc == feeds["vllm:0.32:v2"].fc == 5
    crash = [f.message for f in verdict.findings if f.name == "engine_feed"]
    assert crash and all("captures 3 states but sizes fc for 5" in m for m in crash)


def test_an_empty_id_list_is_named_with_what_each_engine_feeds_instead(tmp_path):
    """tokenspeed #526: an empty list is read as absent, the 3-layer default fed instead."""
    def empty(config):
        config["eagle_aux_hidden_state_layer_ids"] = []
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-eagle3.json", "Qwen__Qwen3-8B.json",
                          empty)
    verdict = examine(draft, target)
    found = [f.message for f in verdict.findings if f.name == "empty_ids"]
    assert len(found) == 1 and "eagle_aux_hidden_state_layer_ids is an empty list" in found[0]
    assert "['block_out:1', 'block_out:17', 'block_out:32']" in found[0]
    assert not verdict.ok
    (tmp_path / "b").mkdir()
    plain = examine(*_dirs(tmp_path / "b", "specforge__qwen3-8b-eagle3.json",
                           "Qwen__Qwen3-8B.json"))  # no key at all: undecided, not this
    assert not [f for f in plain.findings if f.name == "empty_ids"]


def test_a_draft_shorter_than_its_target_is_a_finding_for_every_family(tmp_path):
    """NeMo-RL #3960: a drafter republished only to raise max_position_embeddings 2048 ->
    40960. vLLM 0.32 says it raises it for EAGLE drafts, yet served an EAGLE-3 draft cut
    short at tau 1.000 (bench/damage.py): a finding for EAGLE-3 and DFlash alike."""
    def short(config):
        config["max_position_embeddings"] = 2048
    for name in ("specforge__qwen3-8b-dflash.json", "specforge__qwen3-8b-eagle3.json"):
        (tmp_path / name).mkdir()
        draft, target = _dirs(tmp_path / name, name, "Qwen__Qwen3-8B.json", short)
        config = json.loads((target / "config.json").read_text())
        config["max_position_embeddings"] = 40960
        (target / "config.json").write_text(json.dumps(config))
        verdict = examine(draft, target)
        found = [f.message for f in verdict.findings if f.name == "short_positions"]
        assert found and "set it to at least 40960" in found[0], name
        config["max_position_embeddings"] = 2048  # no longer than the draft: nothing said
        (target / "config.json").write_text(json.dumps(config))
        quiet = examine(draft, target)
        assert not [f for f in quiet.findings if f.name == "short_positions"]
        assert not [n for n in quiet.notes if "max_position_embeddings" in n]


def test_a_dflash_draft_served_in_another_attention_mode_than_trained(tmp_path):
    """Automodel #2913: DFlash-format drafts trained causally need dflash_config.causal, or
    vLLM serves them non-causally. eyas records its own (non-causal); an edit that makes vLLM
    serve it causally is a finding; for another trainer's draft the doctor says what vLLM does."""
    def eyas_written(config):
        config["eyas_family"] = "dflash"
        config["dflash_config"]["causal"] = False
    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-dflash.json", "Qwen__Qwen3-8B.json",
                          eyas_written)
    assert not [f for f in examine(draft, target).findings if f.name == "attention_mode"]
    config = json.loads((draft / "config.json").read_text())
    config["is_causal"] = True  # read before dflash_config.causal (qwen3_dflash.py)
    (draft / "config.json").write_text(json.dumps(config))
    found = [f.message for f in examine(draft, target).findings if f.name == "attention_mode"]
    assert found and "serve it causally (from is_causal)" in found[0]
    (tmp_path / "other").mkdir()
    foreign = examine(*_dirs(tmp_path / "other", "specforge__qwen3-8b-dflash.json",
                             "Qwen__Qwen3-8B.json"))
    assert any("blocks non-causally" in n and "dflash_config.causal" in n for n in foreign.notes)


def test_eyas_writes_its_dflash_drafts_attention_mode_for_vllm():
    from eyas.conventions import vllm_dflash
    from eyas.layout import HiddenStateLayout, TargetIdentity
    args = {k: 8 for k in vllm_dflash.HYPER_KEYS}
    args.update(mask_token_id=3, block_size=4, num_aux_hidden_states=2, num_hidden_layers=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    layout = HiddenStateLayout.from_names(TargetIdentity("LlamaForCausalLM", 4, 8),
                                          ["block_out:0", "block_out:1"], "block_out:3")
    config = vllm_dflash.draft_config(args, layout, "float32")
    assert config["dflash_config"]["causal"] is False
    assert vllm_dflash.served_causal(config) == ([False, False], "dflash_config.causal")


def test_sglang_feeds_a_dflash_draft_without_ids_its_own_default(tmp_path):
    """SGLang builds default DFlash ids from the draft's depth (build_target_layer_ids): a
    5-layer draft on 36-layer Qwen3-8B reads layers 1, 9, 17, 25, 33, captured one later; an
    empty list, though, is a ValueError there."""
    def no_ids(config):
        del config["dflash_config"]["target_layer_ids"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    draft, target = _dirs(tmp_path / "a", "specforge__qwen3-8b-dflash.json",
                          "Qwen__Qwen3-8B.json", no_ids)
    sgl = next(f for f in examine(draft, target).runners if f.runner.engine == "sglang")
    assert not sgl.refused and sgl.stream == [2, 10, 18, 26, 34] and not sgl.problems
    assert "default for a 5-layer draft" in sgl.where
    draft.joinpath("config.json").write_text(json.dumps(
        {**json.loads(draft.joinpath("config.json").read_text()), "num_hidden_layers": 1}))
    one = next(f for f in examine(draft, target).runners if f.runner.engine == "sglang")
    assert one.stream == [19]  # one layer: N // 2, +1

    def empty(config):
        config["dflash_config"]["target_layer_ids"] = []
    draft, target = _dirs(tmp_path / "b", "specforge__qwen3-8b-dflash.json",
                          "Qwen__Qwen3-8B.json", empty)
    sgl = next(f for f in examine(draft, target).runners if f.runner.engine == "sglang")
    assert sgl.stream is None and "non-empty list" in sgl.problems[0]


def test_sglang_refuses_dflash_on_a_target_without_its_capture_hook(tmp_path):
    """Qwen2ForCausalLM has no set_dflash_layers_to_capture in SGLang 0.5.23: SGLang stops at
    startup; Qwen3ForCausalLM has it."""
    from eyas.conventions.sglang import DFLASH_CAPTURE

    draft, target = _dirs(tmp_path, "specforge__qwen3-8b-dflash.json", "Qwen__Qwen3-8B.json")
    sgl = next(f for f in examine(draft, target).runners if f.runner.engine == "sglang")
    assert not sgl.refused
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["Qwen2ForCausalLM"]
    (target / "config.json").write_text(json.dumps(config))
    sgl = next(f for f in examine(draft, target).runners if f.runner.engine == "sglang")
    assert "has no set_dflash_layers_to_capture" in sgl.refused
    # eyas's table is the list read in the wheel (docs/scripts/sglang_dflash_hooks.py)
    read = json.loads((CORPUS.parent / "sglang_dflash_hooks.json").read_text())
    assert DFLASH_CAPTURE == set(read["architectures"])
