"""Every published draft config in tests/data/published_drafts (SpecForge's configs/, TorchSpec,
EAGLE's template, SGLang's test draft, z-lab's DFlash fixtures, a speculators config; sources
in its manifest.json) read by the config-only doctor, against what vLLM 0.32's two runners and
SGLang 0.5.23 feed each draft by their own code (expected.json: the vLLM part computed by
calling vLLM's functions, docs/scripts/published_feeds.py; the SGLang part read in its source,
RULES.md). The answer is the engines' or a refusal that names why; nothing crashes.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eyas.doctor.static import examine
from eyas.targets import TargetError

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "published_drafts"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
EXPECTED = {r["file"]: r for r in json.loads((CORPUS / "expected.json").read_text())["rows"]}
ROWS = [d for d in MANIFEST["drafts"]]


def _draft(tmp_path, row) -> Path:
    shutil.copy(CORPUS / row["file"], tmp_path / "config.json")
    return tmp_path


def _examine(tmp_path, name):
    row = next(r for r in ROWS if r["file"] == name)
    return examine(_draft(tmp_path, row), CORPUS / row["target"])


def test_the_corpus_is_what_its_manifest_says():
    files = {p.name for p in CORPUS.glob("*.json")} - {"manifest.json", "expected.json"}
    assert files == {r["file"] for r in ROWS} == set(EXPECTED)
    assert len(ROWS) >= 50
    for row in ROWS:
        assert row["repo"] and row["path"] and (CORPUS / row["target"]).is_file(), row["file"]


@pytest.mark.parametrize("row", ROWS, ids=[r["file"].removesuffix(".json") for r in ROWS])
def test_each_published_config_is_read_as_the_engines_read_it(tmp_path, row):
    want = EXPECTED[row["file"]]
    target = json.loads((CORPUS / row["target"]).read_text())
    if not target.get("architectures"):  # not a published config (manifest note): refused
        with pytest.raises(TargetError, match="architectures"):
            examine(_draft(tmp_path, row), CORPUS / row["target"])
        return
    verdict = examine(_draft(tmp_path, row), CORPUS / row["target"])
    feeds = {f.runner.id: f for f in verdict.runners}
    vllm = want["vllm"]
    assert verdict.reading.target.num_layers == vllm["target_N"]
    supported = vllm["target"].get("supports_eagle3",
                                   vllm["target"].get("supports_eagle3_read_from_source"))
    for runner, expected in (("vllm:0.32:v1", vllm["v1"]), ("vllm:0.32:v2", vllm["v2"])):
        got = feeds[runner]
        if supported is False:
            assert "no EAGLE-3 interface" in got.refused and got.slots is None
            continue
        assert got.stream == expected["capture"], (runner, got.where)
        refusals = vllm["v1_refuses"] if runner.endswith("v1") else []
        if not vllm["draft_accepted"] or refusals:
            assert got.refused, (runner, "vLLM refuses this draft; eyas must say so")
        else:
            assert not got.refused, (runner, got.refused)
            assert got.fc == vllm["fc_slots"]
    sglang = want["sglang"]
    got = feeds["sglang:0.5.23"]
    if sglang.get("capture") is None:
        assert got.refused or got.problems or got.stream is None
    else:
        assert got.stream == sglang["capture"], got.where
        if "?" in str(sglang.get("algorithm")) or sglang.get("rule") is None:
            pass  # SGLang's path for it is not certain: eyas may refuse to vouch for it
    json.dumps(verdict.to_dict())  # --json: machine-readable whatever the family


def test_deepseek_v3_ids_only_under_eagle_config_part_the_two_vllm_runners(tmp_path):
    v = _examine(tmp_path, "specforge__deepseek-v3-671b-eagle3.json")
    feeds = {f.runner.id: f for f in v.runners}
    assert feeds["vllm:0.32:v1"].slots == ["block_out:0", "block_out:28", "block_out:56"]
    assert feeds["vllm:0.32:v1"].read.key.path == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert feeds["vllm:0.32:v2"].read.key is None  # V2 never reads eagle_config's list
    assert feeds["vllm:0.32:v2"].slots == ["block_out:1", "block_out:29", "block_out:57"]
    assert "runners_disagree" in [f.name for f in v.findings]
    # SpecForge wrote them in SGLang's convention: what V2 and SGLang feed is what it trained on
    assert v.reading.claimed == feeds["sglang:0.5.23"].slots == feeds["vllm:0.32:v2"].slots
    d = v.to_dict()
    assert d["engines"][0]["hf_hidden_states"] == [1, 29, 57]
    assert d["claimed"]["hf_hidden_states"] == [2, 30, 58]


def test_targets_are_read_by_capture_convention_not_by_name(tmp_path):
    # a multimodal wrapper: depth and width from its text_config, served by vLLM
    (tmp_path / "vl").mkdir()
    vl = _examine(tmp_path / "vl", "specforge__qwen2-5-vl-7b-eagle3.json")
    assert vl.reading.target.architecture == "Qwen2_5_VLForConditionalGeneration"
    assert not any(f.refused for f in vl.runners if f.runner.engine == "vllm")
    # gpt-oss: Llama's capture in vLLM, its own rule in SGLang (raw when the last id is N)
    (tmp_path / "oss").mkdir()
    oss = _examine(tmp_path / "oss", "specforge__gpt-oss-120B-eagle3.json")
    assert {f.runner.id: f.stream for f in oss.runners} == {
        "vllm:0.32:v1": [1, 17, 33], "vllm:0.32:v2": [2, 18, 33], "sglang:0.5.23": [2, 18, 34]}
    # LongCat-Flash keeps its depth under num_layers: read, and refused for what it is
    (tmp_path / "lc").mkdir()
    lc = _examine(tmp_path / "lc", "specforge__longcat-flash-eagle3.json")
    assert lc.reading.target.num_layers == 28 and lc.status.startswith("FAULT (not_served")
    assert "no EAGLE-3 interface" in lc.findings[0].message


def test_eagle_template_and_newer_families_say_what_each_engine_feeds(tmp_path):
    for name, family in (("eagle__traineagle3-llama3.1-8b.json", "eagle3"),
                         ("specforge__qwen3-8b-dflash.json", "dflash"),
                         ("specforge__qwen3-8b-dspark.json", "dspark"),
                         ("specforge__qwen3-8b-domino.json", "domino"),
                         ("specforge__qwen3-8b-peagle.json", "peagle")):
        (tmp_path / family).mkdir()
        v = _examine(tmp_path / family, name)
        assert v.reading.family == family
        text = v.explain()
        assert all(f.runner.label in text for f in v.runners)
        if family not in ("eagle3", "peagle"):  # eyas trains and scores P-EAGLE drafts
            assert any(f"a {family} draft: eyas reads what each engine feeds" in n
                       for n in v.notes)
    (tmp_path / "d").mkdir()
    d = _examine(tmp_path / "d", "specforge__qwen3-8b-dflash.json")
    assert d.ok and d.reading.claimed == [f"block_out:{i}" for i in (1, 9, 17, 25, 33)]
    assert all(f.slots == d.reading.claimed for f in d.runners)  # +1 in vLLM and SGLang alike
    # TorchSpec's DFlash config names its ids only at the top level: V1 never reads that key
    (tmp_path / "t").mkdir()
    t = _examine(tmp_path / "t", "torchspec__dflash_draft_config.json")
    assert {"runners_disagree", "engine_feed"} <= {f.name for f in t.findings}


def test_an_eagle_config_dict_replaces_dflash_ids_in_the_v1_runner_only(tmp_path):
    config = json.loads((CORPUS / "specforge__qwen3-8b-dflash.json").read_text())
    config["eagle_config"] = {"use_aux_hidden_state": True}  # no ids: V1 falls to its default
    (tmp_path / "config.json").write_text(json.dumps(config))
    v = examine(tmp_path, CORPUS / "targets" / "Qwen__Qwen3-8B.json")
    feeds = {f.runner.id: f for f in v.runners}
    assert feeds["vllm:0.32:v1"].read.key is None and feeds["vllm:0.32:v1"].stream == [2, 18, 33]
    assert feeds["vllm:0.32:v2"].stream == [2, 10, 18, 26, 34]
    assert "runners_disagree" in [f.name for f in v.findings]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM installed")
@pytest.mark.parametrize("script", ["published_feeds.py", "vllm_eagle3_targets.py"])
def test_the_tables_match_the_installed_engine(script):
    """expected.json's vLLM part and eyas's table of EAGLE-3 targets, recomputed from the
    installed vLLM's own code and source: a vLLM upgrade that changes them fails here."""
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "scripts" / script), "--check"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_the_loader_names_a_newer_family_it_cannot_score(tmp_path):
    import torch
    from safetensors.torch import save_file

    from eyas.draft.claims import FormatError
    from eyas.draft.load import read_claims
    from eyas.targets import shape_from_config

    row = next(r for r in ROWS if r["file"] == "specforge__qwen3-8b-dflash.json")
    draft = _draft(tmp_path, row)
    save_file({"fc.weight": torch.zeros(2, 2)}, str(draft / "model.safetensors"))
    target = shape_from_config(json.loads((CORPUS / row["target"]).read_text()))
    with pytest.raises(FormatError, match="a dflash draft .*cannot yet train or score dflash "
                                          "drafts.*eyas doctor draft=.* static=true"):
        read_claims(draft, target)
