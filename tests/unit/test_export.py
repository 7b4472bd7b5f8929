"""Export for vLLM and SGLang: ids compiled per engine, weights unchanged, launch flags."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.draft.checkpoint import save_draft
from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
from eyas.draft.vocab import build_vocab
from eyas.layout import HiddenStateLayout, LayoutError
from eyas.serve.export import export_sglang, export_vllm, launch_command
from eyas.targets import identify
from eyas.targets.parts import target_parts
from helpers import make_tiny_target
from transformers import AutoConfig
from workflows.export import main as export_main


def _draft(tmp_path, slots):
    target = make_tiny_target(tmp_path / "target", "llama", layers=4, hidden=32)
    layout = HiddenStateLayout.from_names(identify(target), slots)
    embed, _ = target_parts(target)
    vocab = build_vocab(torch.arange(embed.shape[0], 0, -1).double(), 64)
    config = Eagle3Config.from_target(AutoConfig.from_pretrained(target), len(slots), 64)
    torch.manual_seed(0)
    out = save_draft(Eagle3Draft(config, embed, vocab), layout, vocab, tmp_path / "draft")
    return target, out, layout


def test_sglang_gets_its_own_ids_and_the_same_weights(tmp_path):
    target, draft, layout = _draft(tmp_path, ["embed", "block_out:1", "block_out:2"])
    out = export_sglang(draft, tmp_path / "sglang", "0.5.23")
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 1, 2]
    assert "eagle_aux_hidden_state_layer_ids" not in config  # SGLang ignores it; vLLM would misread
    assert json.loads((draft / "config.json").read_text())[
        "eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    a, b = load_file(draft / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert export_vllm(draft, tmp_path / "vllm").joinpath("config.json").exists()


def test_sglang_refuses_what_it_cannot_serve(tmp_path):
    _, draft, _ = _draft(tmp_path, ["block_out:1", "block_out:2"])
    with pytest.raises(LayoutError, match="sizes fc for 3"):
        export_sglang(draft, tmp_path / "sglang")
    _, draft3, _ = _draft(tmp_path / "b", ["block_out:1", "block_out:2", "block_out:3"])
    with pytest.raises(LayoutError, match="never captures block_out:3"):
        export_sglang(draft3, tmp_path / "sglang3")


def test_sglang_version_is_checked_for_llama_targets(tmp_path, capsys):
    target, draft, _ = _draft(tmp_path, ["embed", "block_out:1", "block_out:2"])
    with pytest.raises(LayoutError,
                       match=r"SGLang 0.6.0: .*not been verified \(verified: 0.5.23\)"):
        export_sglang(draft, tmp_path / "sglang", "0.6.0")
    assert not (tmp_path / "sglang").exists()
    assert export_main(["--draft", str(draft), "--target", str(target), "--out",
                        str(tmp_path / "out"), "--sglang-version", "0.6.0"]) == 2
    err = capsys.readouterr().err
    assert "SGLang 0.6.0" in err and "--sglang-version 0.5.23" in err
    assert not (tmp_path / "out" / "sglang").exists()
    config = json.loads((export_sglang(draft, tmp_path / "s2") / "config.json").read_text())
    assert config["eyas_engine"] == {"engine": "sglang", "version": "0.5.23"}


def test_missing_vocab_map_is_refused(tmp_path):
    _, draft, _ = _draft(tmp_path, ["embed", "block_out:1", "block_out:2"])
    tensors = load_file(draft / "model.safetensors")
    del tensors["d2t"]
    save_file(tensors, draft / "model.safetensors")
    with pytest.raises(LayoutError, match="d2t/t2d missing"):
        export_vllm(draft, tmp_path / "x")


def test_launch_commands_and_cli(tmp_path, capsys):
    for family, extra in (("eagle3", ""), ("peagle", ',"parallel_drafting":true'),
                          ("dflash", "")):
        d = tmp_path / family
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"eyas_family": family}))
        method = "dflash" if family == "dflash" else "eagle3"
        assert launch_command("vllm", "/m", str(d), 3) == (
            "vllm serve /m --speculative-config "
            f"'{{\"method\":\"{method}\"{extra},\"model\":\"{d}\","
            "\"num_speculative_tokens\":3}'")
    assert "--speculative-num-steps 5 --speculative-eagle-topk 1 " \
           "--speculative-num-draft-tokens 6" in launch_command("sglang", "/m", "/d", 5)
    with pytest.raises(ValueError, match="cap the drafted tokens"):
        launch_command("sglang", "/m", "/d", 5, num_draft_tokens=4)
    target, draft, _ = _draft(tmp_path, ["embed", "block_out:1", "block_out:2"])
    assert export_main(["--draft", str(draft), "--target", str(target),
                        "--out", str(tmp_path / "out"), "--sglang-version", "0.5.23"]) == 0
    printed = capsys.readouterr().out
    assert "vllm serve" in printed and "sglang.launch_server" in printed
    assert export_main(["--draft", str(tmp_path), "--target", str(target),
                        "--out", str(tmp_path / "o2")]) == 2


def _write_profile(folder, name, accepted_per_step, **changes):
    from eyas.acceptance import AcceptanceStats
    from eyas.doctor.profile import build_profile

    profile = build_profile(AcceptanceStats.from_rounds(accepted_per_step, 3), method="eagle3",
                            draft_id="run/draft", target_id="run/target",
                            num_speculative_tokens=3, producer="test",
                            measurement_conditions={"dataset": name})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({**profile, **changes}))
    return profile


def test_a_runs_profiles_travel_with_the_draft(tmp_path):
    run = tmp_path / "run"
    target, draft, _ = _draft(run / "train", ["embed", "block_out:1", "block_out:2"])
    offline = _write_profile(run / "evaluate", "speculation_profile.json", [3, 0, 1])
    _write_profile(run / "evaluate", "speculation_profile.code.json", [1, 1])
    (run / "evaluate" / "report.json").write_text("{}")  # not a profile: not copied
    out = export_vllm(draft, tmp_path / "vllm")
    read = lambda name: json.loads((out / name).read_text())  # noqa: E731
    assert sorted(p.name for p in out.glob("speculation_profile*")) == [
        "speculation_profile.json", "speculation_profile.offline.code.json",
        "speculation_profile.offline.json"]
    assert read("speculation_profile.json") == offline  # no served profile: the offline one
    assert read("speculation_profile.offline.code.json")["measurement_conditions"] == {
        "dataset": "speculation_profile.code.json"}
    served = _write_profile(run / "serve", "speculation_profile.json", [2, 2, 0])
    out = export_sglang(draft, tmp_path / "sglang", "0.5.23")
    assert read("speculation_profile.json") == served != offline
    assert read("speculation_profile.offline.json") == offline
    assert read("speculation_profile.served.json") == served


def test_profiles_from_named_folders_and_broken_ones_refused(tmp_path, capsys):
    from eyas.doctor.profile import ProfileError

    target, draft, _ = _draft(tmp_path, ["embed", "block_out:1", "block_out:2"])  # not a run's
    assert not list(export_vllm(draft, tmp_path / "plain").glob("speculation_profile*"))
    served = _write_profile(tmp_path / "bench", "speculation_profile.json", [3, 3])
    out = export_vllm(draft, tmp_path / "named", profile_dirs={"served": tmp_path / "bench"})
    assert json.loads((out / "speculation_profile.json").read_text()) == served
    assert export_main(["--draft", str(draft), "--target", str(target), "--out",
                        str(tmp_path / "cli"), "--served-profiles", str(tmp_path / "bench")]) == 0
    assert ("speculation profiles: speculation_profile.json, speculation_profile.served.json"
            in capsys.readouterr().out)
    _write_profile(tmp_path / "bench", "speculation_profile.chat.json", [1, 0],
                   conditional_accept_rates=[1.2, 0.0, 0.0])
    with pytest.raises(ProfileError, match=r"bench/speculation_profile.chat.json: .*"
                                           r"conditional_accept_rates\[0\]: 1.2"):
        export_vllm(draft, tmp_path / "refused", profile_dirs={"served": tmp_path / "bench"})
    assert not (tmp_path / "refused").exists()  # refused before anything was written
    assert export_main(["--draft", str(draft), "--target", str(target), "--out",
                        str(tmp_path / "cli2"), "--served-profiles", str(tmp_path / "bench")]) == 2
    assert "conditional_accept_rates[0]: 1.2" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="nowhere: no such folder of offline"):
        export_vllm(draft, tmp_path / "x", profile_dirs={"offline": tmp_path / "nowhere"})
