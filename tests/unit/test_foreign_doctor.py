"""The doctor on drafts other tools wrote: the trained eyas draft rewritten by each tool's
schema (tests/foreign_drafts.py as_eagle3 / as_specforge / as_speculators name the upstream files),
examined with --data and --engine. A correct one is OK; a wrong config is a FAULT naming the
ids to write for the engine named; --write-fixed's config then passes."""
from __future__ import annotations

import json

import pytest
from foreign_drafts import (as_eagle3, as_mla, as_specforge, as_speculators, build_block_world,
                            train_mla_draft)

from workflows import doctor

pytestmark = pytest.mark.usefixtures("one_thread")
# A correct draft gets OK, or INCONCLUSIVE where the evidence cannot separate close layouts
# (the issue's "OK (or INCONCLUSIVE with the reason)"); never FAULT. The engine line says OK.
NOT_FAULT = (doctor.OK, getattr(doctor, "INCONCLUSIVE", doctor.OK))


def _run(world, capsys, draft, *extra, data=None):
    code = doctor.main(["--data", str(data or world.data), "--draft", str(draft),
                        "--target", str(world.target), *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_eagle3_without_eyas_keys_is_examined_not_refused(trained_world, capsys, tmp_path):
    # both places, vLLM's convention: what a vLLM user writes; eyas's layout [embed, 1, 3]
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", top=[0, 2, 4], nested=[0, 2, 4])
    code, out = _run(trained_world, capsys, draft)
    assert code in NOT_FAULT and "engine: OK" in out, out
    assert "refusing to guess" not in out
    assert ("engine: vLLM 0.32 V1 runner reads ids [0, 2, 4] (eagle_aux_hidden_state_layer_ids, "
            "as written") in out


def test_ids_only_top_level_are_ok_on_vllm_and_a_fault_on_sglang(trained_world, capsys,
                                                                  tmp_path):
    # vLLM 0.32 captures the top-level list and sizes fc 3 by default: served right. SGLang
    # reads only eagle_config, so it falls back to its default (2, 3, 3) on 6 blocks.
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", top=[0, 2, 4])
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm:0.32")
    assert code in NOT_FAULT and "engine: OK" in out, out
    code, out = _run(trained_world, capsys, draft, "--engine", "sglang:0.5.23")
    assert code == doctor.FAULT, out
    assert "FAULT (engine_feed)" in out
    assert "eagle_config.eagle_aux_hidden_state_layer_ids [-1, 1, 3]" in out


def test_ids_missing_vllm_default_is_a_fault_with_the_ids(trained_world, capsys, tmp_path):
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d")
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm")
    assert code == doctor.FAULT, out
    assert "its default [2, 3, 3]" in out  # vLLM's fallback, collapsed to 2 states
    assert "eagle_aux_hidden_state_layer_ids [0, 2, 4] at the top level and under eagle_config" \
        in out


def test_shifted_foreign_draft_fault_names_the_right_ids(trained_world, capsys, tmp_path):
    # config says vLLM ids [1, 3, 5] ([block 0, 2, 4]); the weights were trained on [0, 2, 4]
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", top=[1, 3, 5], nested=[1, 3, 5])
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm",
                     "--write-fixed", str(tmp_path / "fixed"))
    assert code == doctor.FAULT, out
    assert "engine_feed" in out.splitlines()[0]
    assert "[embedding, block 1, block 3]" in out
    assert "eagle_aux_hidden_state_layer_ids [0, 2, 4] at the top level" in out
    fixed = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert fixed["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    assert json.loads((draft / "config.json").read_text())[
        "eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]  # the original untouched
    code, out = _run(trained_world, capsys, tmp_path / "fixed", "--engine", "vllm")
    assert code in NOT_FAULT and "engine: OK" in out, out


def test_speculators_draft_ok_and_four_id_list_fault(trained_world, capsys, tmp_path):
    embed = trained_world.embed
    good = as_speculators(trained_world.draft_dir, tmp_path / "s", [0, 2, 4], embed)
    code, out = _run(trained_world, capsys, good, "--engine", "vllm")
    assert code in NOT_FAULT and "engine: OK" in out, out
    assert "format: speculators" in out
    # launch_vllm's capture list [2, N//2, N-3, N] style: the verifier's id passed to training
    four = as_speculators(trained_world.draft_dir, tmp_path / "s4", [0, 2, 4, 6], embed)
    code, out = _run(trained_world, capsys, four, "--engine", "vllm")
    assert code == doctor.FAULT, out
    assert "captures 4 states but sizes fc for 3" in out
    assert "[0, 2, 4] at the top level" in out


def test_speculators_full_vocabulary_without_d2t_is_not_a_vocab_fault(trained_world, capsys,
                                                                     tmp_path):
    draft = as_speculators(trained_world.draft_dir, tmp_path / "s", [0, 2, 4],
                           trained_world.embed, full_vocab=True)
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm")
    assert "d2t" not in out.splitlines()[0], out
    assert code in NOT_FAULT and "engine: OK" in out, out


def test_reduced_vocabulary_without_d2t_is_a_fault(trained_world, capsys, tmp_path):
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", top=[0, 2, 4], nested=[0, 2, 4],
                      drop=("d2t", "t2d"))
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm")
    assert code == doctor.FAULT and "d2t_missing" in out.splitlines()[0], out


def test_specforge_norm_output_is_refused_naming_what_it_means_there(trained_world, capsys,
                                                                    tmp_path):
    # SpecForge's norm_output means "norm before lm_head"; vLLM would feed the post-norm state
    draft = as_specforge(trained_world.draft_dir, tmp_path / "f", [0, 2, 4],
                         extra={"norm_output": True})
    code, out = _run(trained_world, capsys, draft)
    assert code == doctor.BAD_INPUT and "norm_output" in out and "SpecForge" in out, out


def test_speculators_without_norm_before_residual_is_examined_as_vllm_serves_it(
        trained_world, capsys, tmp_path):
    draft = as_speculators(trained_world.draft_dir, tmp_path / "s", [0, 2, 4],
                           trained_world.embed)
    config = json.loads((draft / "config.json").read_text())
    del config["norm_before_residual"]  # vLLM's converter then turns it on
    (draft / "config.json").write_text(json.dumps(config))
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm")
    assert code != doctor.BAD_INPUT, out
    assert "norm_before_residual is absent" in out, out


@pytest.fixture(scope="module")
def block_world(trained_world, tmp_path_factory):
    import torch
    torch.set_num_threads(1)
    return build_block_world(trained_world, tmp_path_factory.mktemp("block-world"))


def test_specforge_draft_ok_on_sglang_fault_on_vllm(trained_world, block_world, capsys,
                                                    tmp_path):
    # trained on [block 1, 2, 4]: SpecForge/SGLang ids [1, 2, 4] (output of layer k)
    draft = as_specforge(block_world.draft_dir, tmp_path / "f", [1, 2, 4])
    code, out = _run(trained_world, capsys, draft, "--engine", "sglang:0.5.23",
                     data=block_world.data)
    assert code in NOT_FAULT and "engine: OK" in out, out
    assert "format: specforge" in out
    # vLLM reads the same list as inputs of layers: [block 0, 1, 3], one layer early (43671)
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm:0.32",
                     "--write-fixed", str(tmp_path / "fixed"), data=block_world.data)
    assert code == doctor.FAULT, out
    assert "feeds [block 0, block 1, block 3]" in out
    assert "eagle_aux_hidden_state_layer_ids [2, 3, 5] at the top level" in out
    code, out = _run(trained_world, capsys, tmp_path / "fixed", "--engine", "vllm",
                     data=block_world.data)
    assert code in NOT_FAULT and "engine: OK" in out, out


def test_sglang_convention_ids_written_for_vllm_are_found_by_the_evidence(
        trained_world, block_world, capsys, tmp_path):
    # SGLang's ids [1, 2, 4] written top-level, where vLLM reads them as its own convention
    draft = as_eagle3(block_world.draft_dir, tmp_path / "d", top=[1, 2, 4], nested=[1, 2, 4])
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm", data=block_world.data)
    assert code == doctor.FAULT, out
    assert "the evidence table fits" in out
    assert "eagle_aux_hidden_state_layer_ids [2, 3, 5] at the top level" in out


def _prompt_file(path):
    from world import rule_conversations
    path.write_text("\n".join(c[0]["content"] for c in rule_conversations(16, seed=7)) + "\n")
    return path


def test_without_data_the_doctor_builds_its_own_probe(trained_world, capsys, tmp_path):
    w, prompts = trained_world, _prompt_file(tmp_path / "prompts.txt")
    good = as_eagle3(w.draft_dir, tmp_path / "d", top=[0, 2, 4], nested=[0, 2, 4])
    code = doctor.main(["--draft", str(good), "--target", str(w.target), "--engine", "vllm",
                        "--prompts", str(prompts), "--probe-dir", str(tmp_path / "probe")])
    out = capsys.readouterr().out
    assert code in NOT_FAULT and "engine: OK" in out, out
    assert "16 probe samples" in out  # the probe it built, not a run's extraction
    shifted = as_eagle3(w.draft_dir, tmp_path / "s", top=[1, 3, 5], nested=[1, 3, 5])
    code = doctor.main(["--draft", str(shifted), "--target", str(w.target), "--engine", "vllm",
                        "--prompts", str(prompts)])
    out = capsys.readouterr().out
    # which of the better-fitting layouts the fix names is the evidence rule's choice
    # (eyas/doctor/evidence.py); the config's own ids are never what it says to write
    assert code == doctor.FAULT and "engine_feed" in out.splitlines()[0], out
    assert "eagle_aux_hidden_state_layer_ids [1, 3, 5] at the top level" not in out


def test_without_data_an_eyas_draft_is_not_held_to_its_training_record(trained_world, capsys,
                                                                       tmp_path):
    # the probe is the target's answers to other prompts: accuracy there is not comparable
    # with what training measured on its own data, so no accuracy gap can be claimed
    w, prompts = trained_world, _prompt_file(tmp_path / "prompts.txt")
    code = doctor.main(["--draft", str(w.draft_dir), "--target", str(w.target), "--engine",
                        "vllm", "--prompts", str(prompts)])
    out = capsys.readouterr().out
    assert code in NOT_FAULT and "accuracy_gap" not in out, out
    assert "not the draft's training data" in out, out


@pytest.fixture(scope="module")
def mla_draft(trained_world):
    return train_mla_draft(trained_world, trained_world.base)


def test_mla_draft_correct_is_not_a_fault_shifted_is_with_and_without_data(
        trained_world, mla_draft, capsys, tmp_path):
    """A DeepSeek/Kimi-style draft (multi-head latent attention, vLLM's deepseek_eagle3
    schema) is read as vLLM serves it: its correct ids pass, shifted ids are a FAULT naming
    the ids; the fixed config keeps the MLA architecture and passes."""
    good = as_mla(mla_draft, tmp_path / "good", ids=[0, 2, 4])
    code, out = _run(trained_world, capsys, good, "--engine", "vllm")
    assert code in NOT_FAULT and "engine: OK" in out, out
    assert "format: eagle3-mla" in out and "multi-head latent attention" in out
    shifted = as_mla(mla_draft, tmp_path / "shifted", ids=[1, 3, 5])
    code, out = _run(trained_world, capsys, shifted, "--engine", "vllm",
                     "--write-fixed", str(tmp_path / "fixed"))
    assert code == doctor.FAULT, out
    assert out.splitlines()[0] == "skew doctor: FAULT (shifted, engine_feed)"  # each kind once
    assert "eagle_aux_hidden_state_layer_ids [0, 2, 4] at the top level" in out
    fixed = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert fixed["architectures"] == ["Eagle3DeepseekV3ForCausalLM"]
    assert fixed["kv_lora_rank"] == 16 and fixed["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    code, out = _run(trained_world, capsys, tmp_path / "fixed", "--engine", "vllm")
    assert code in NOT_FAULT and "engine: OK" in out, out
    code = doctor.main(["--draft", str(shifted), "--target", str(trained_world.target),
                        "--engine", "vllm", "--prompts", str(_prompt_file(tmp_path / "p.txt"))])
    out = capsys.readouterr().out
    assert code == doctor.FAULT and "engine_feed" in out.splitlines()[0], out


def test_mla_draft_refusals_name_what_vllm_would_do(trained_world, mla_draft, capsys, tmp_path):
    asked = as_mla(mla_draft, tmp_path / "nbf", ids=[0, 2, 4], extra={"norm_before_fc": True})
    code, out = _run(trained_world, capsys, asked, "--engine", "vllm")
    assert code == 2 and "deepseek_eagle3 has no such norm" in out, out
    good = as_mla(mla_draft, tmp_path / "good", ids=[0, 2, 4])
    code, out = _run(trained_world, capsys, good, "--engine", "sglang:0.5.23")
    assert code == 2 and "examine it with --engine vllm" in out, out


def test_ids_only_under_eagle_config_are_a_fault_where_vllms_runners_disagree(
        trained_world, capsys, tmp_path):
    # vLLM ids [0, 2, 4] (eyas's layout [embed, 1, 3]) only under eagle_config: the CPU build's
    # V1 runner captures them, a GPU's V2 runner never reads that key and feeds its default
    # (2, 3, 3) on 6 blocks. The verdict names both runners and the config right under both.
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", nested=[0, 2, 4])
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm:0.32")
    assert code == doctor.FAULT and "runners_disagree" in out, out
    assert "vLLM 0.32 V1 runner: feeds" in out and "vLLM 0.32 V2 runner: feeds" in out
    fixed = tmp_path / "fixed"
    _run(trained_world, capsys, draft, "--engine", "vllm:0.32", "--write-fixed", str(fixed))
    code, out = _run(trained_world, capsys, fixed, "--engine", "vllm:0.32")
    assert code in NOT_FAULT and "runners_disagree" not in out, out


def test_a_norm_option_the_weights_were_not_trained_with_is_found_by_the_evidence(
        trained_world, capsys, tmp_path):
    # trained with norm_output off; a config that says on (SpecForge's older meaning of the
    # key) makes vLLM feed the post-norm state back: the weights fit "off" beyond doubt
    draft = as_eagle3(trained_world.draft_dir, tmp_path / "d", top=[0, 2, 4], nested=[0, 2, 4])
    config = json.loads((draft / "config.json").read_text())
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm:0.32")
    assert code in NOT_FAULT and "norm_options" not in out, out
    assert "norm options: the config's setting against each flipped" in out
    config["norm_output"] = True
    (draft / "config.json").write_text(json.dumps(config))
    code, out = _run(trained_world, capsys, draft, "--engine", "vllm:0.32")
    assert code == doctor.FAULT and "norm_options" in out, out
    assert "fit norm_output: false better" in out
