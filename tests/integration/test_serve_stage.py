"""The serve stage on the tiny run's artifacts: parity refuses a draft fed other tensors,
force benchmarks anyway, and vLLM's acceptance agrees with the reference engine's."""
import json
import shutil

import pytest

from eyas.config import ServeConfig
from eyas.serve.parity import ParityError
from eyas.serve.run import serve_run
from helpers import vllm_installed

pytestmark = [pytest.mark.integration, pytest.mark.vllm,
              pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed")]


def _target(run):
    from eyas.run_records import target_path
    return target_path(run)


def test_parity_failure_names_what_the_engine_feeds(tiny_run, tmp_path):
    # A draft from "another trainer": no eyas layout inside, ids shifted by one block.
    foreign = tmp_path / "foreign"
    shutil.copytree(tiny_run / "train" / "draft", foreign)
    config = json.loads((foreign / "config.json").read_text())
    del config["eyas_layout"]
    config["eagle_aux_hidden_state_layer_ids"] = [2, 3, 4]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 3, 4]
    (foreign / "config.json").write_text(json.dumps(config))
    cfg = ServeConfig(engine="vllm", num_prompts=2, max_new_tokens=8)
    with pytest.raises(ParityError, match=r"engine feeds \[block 1, block 2, block 3\]; the "
                                          r"draft was trained on \[block 0, block 1, block 2\]"):
        serve_run(_target(tiny_run), foreign, tiny_run / "extract", cfg, tmp_path / "a")
    assert json.loads((tmp_path / "a" / "report.json").read_text())["parity"] is False
    forced = serve_run(_target(tiny_run), foreign, tiny_run / "extract",
                       ServeConfig(engine="vllm", num_prompts=2, max_new_tokens=8, force=True),
                       tmp_path / "b")
    assert forced["parity"] is False and forced["forced"] is True and forced["lossless"]


def test_vllm_and_reference_acceptance_agree(tiny_run, tmp_path):
    draft = tiny_run / "train" / "draft"
    reports = {engine: serve_run(_target(tiny_run), draft, tiny_run / "extract",
                                 ServeConfig(engine=engine, num_prompts=4, max_new_tokens=16),
                                 tmp_path / engine)
               for engine in ("vllm", "reference")}
    vllm, ref = reports["vllm"], reports["reference"]
    assert vllm["parity"] is True and vllm["lossless"] and ref["lossless"]
    # the reference engine reads the slots with the extractor's own hooks: nothing to prove
    assert ref["parity"] is None and "not applicable" in ref["parity_detail"]["message"]
    assert abs(vllm["tau"] - ref["tau"]) <= 0.1 * ref["tau"], (vllm["tau"], ref["tau"])
    for a, b in zip(vllm["per_position_acceptance"], ref["per_position_acceptance"]):
        assert abs(a - b) <= 0.15


def test_the_gap_alarm_fails_serving_a_draft_that_falls_short_of_its_offline_profile(
        tiny_run, tmp_path):
    """The evaluate stage's offline profile is the run's draft's; a copy of that draft whose
    lm_head was scrambled is served against it: its acceptance falls short at position 1 far
    beyond the noise, so the stage fails, naming the position, after writing the report;
    serve.force records the finding and finishes. (The reference engine: no boot needed.)"""
    from safetensors.torch import load_file, save_file
    import torch

    from eyas.serve.run import ServedGap

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_run / "train" / "draft", damaged)
    weights = load_file(str(damaged / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    weights["lm_head.weight"] = torch.randn(weights["lm_head.weight"].shape, generator=g)
    save_file(weights, str(damaged / "model.safetensors"))
    cfg = ServeConfig(engine="reference", num_prompts=4, max_new_tokens=16)
    args = (_target(tiny_run), damaged, tiny_run / "extract")
    with pytest.raises(ServedGap, match=r"heldout.*position 1: served") as e:
        serve_run(*args, cfg, tmp_path / "a", offline_dir=tiny_run / "evaluate")
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert [f["name"] for f in report["gap"]["findings"]] == ["served_gap"]
    assert report["tau"] < 2.0 and "serve.force" in str(e.value)
    forced = serve_run(*args, ServeConfig(engine="reference", num_prompts=4, max_new_tokens=16,
                                          force=True), tmp_path / "b",
                       offline_dir=tiny_run / "evaluate")
    assert forced["gap"]["findings"] and forced["lossless"]
    # the run's own draft against its own offline profile: quiet
    quiet = serve_run(_target(tiny_run), tiny_run / "train" / "draft", tiny_run / "extract", cfg,
                      tmp_path / "c", offline_dir=tiny_run / "evaluate")
    assert quiet["gap"]["compared"] == ["heldout"] and quiet["gap"]["findings"] == []
