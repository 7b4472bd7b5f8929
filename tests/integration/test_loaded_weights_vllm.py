"""The draft vLLM holds is the draft eyas trained, on the tiny run: the run's own draft is
served with its loaded weights proven and recorded; damage done inside the engine names the
tensor; and a draft damaged each way users reported is refused before any engine boots, with
its own finding, though vLLM itself boots and serves the damaged weights."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from eyas.config import ServeConfig
from helpers import vllm_installed

_spec = importlib.util.spec_from_file_location(  # the bench's damage, made the same way
    "damage", Path(__file__).resolve().parents[2] / "bench" / "damage.py")
_damage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_damage)
damaged_copy = _damage.damaged_copy

pytestmark = [pytest.mark.integration, pytest.mark.vllm,
              pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed")]


def _target(run):
    from eyas.run_records import target_path
    return target_path(run)


def test_the_runs_draft_is_served_with_its_loaded_weights_proven(tiny_run):
    report = json.loads((tiny_run / "serve" / "report.json").read_text())
    weights = report["parity_detail"]["weights"]
    assert weights["ok"] and report["parity"] is True and weights["findings"] == []
    names = {t["name"] for t in weights["tensors"]}
    assert {"model.fc.weight", "lm_head.weight", "draft_id_to_target_id",
            "model.layers.0.self_attn.qkv_proj.weight"} <= names
    assert all(t["status"] == "equal" and t["checksum"] == t["held_checksum"]
               for t in weights["tensors"])
    assert weights["logits"]["error"] <= weights["logits"]["tolerance"]
    assert "loaded weights" in report["parity_detail"]["message"]
    assert report["diagnosis"] == []  # the trained draft contributes


def test_a_tensor_damaged_inside_the_engine_names_itself(tiny_run):
    """The file intact, the engine's copy of the final norm zeroed after loading (as vLLM's
    sleep/wake left a tied draft's head empty): parity names the tensor, and the drafter's
    logits no longer match eyas's forward."""
    from eyas.engines.vllm_draft_logits import drafter
    from eyas.engines.vllm_engine import VllmEngine
    from eyas.serve.loaded import loaded_parity
    from eyas.serve.parity import engine_options
    from eyas.store.reader import ExtractedDataset

    draft, target = tiny_run / "train" / "draft", _target(tiny_run)
    probe = ExtractedDataset(tiny_run / "extract", "probe")
    first, second = (probe[i].input_ids.tolist() for i in (0, 1))  # a new prompt: no cache
    with VllmEngine(target, draft, 3, engine_options(max(map(len, (first, second))) + 8)
                    ) as engine:
        intact = loaded_parity(engine, draft, target, first, "float32")
        drafter(engine).model.model.norm.weight.data.zero_()
        damaged = loaded_parity(engine, draft, target, second, "float32")
    assert intact["ok"], intact["message"]
    assert [f["name"] for f in damaged["findings"]] == ["weights_zeroed"]
    assert "model.norm.weight (from norm.weight)" in damaged["message"]
    assert damaged["logits"]["error"] > 10 * intact["logits"]["error"]


def _ids(value):
    def edit(c):
        c["eagle_aux_hidden_state_layer_ids"] = value
        c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = value
    return edit


DAMAGE = {
    "removed": (dict(weights=lambda w: w.pop("midlayer.mlp.down_proj.weight")),
                "weights_format", "missing ['midlayer.mlp.down_proj.weight']"),
    "zeroed": (dict(weights=lambda w: w["midlayer.mlp.down_proj.weight"].zero_()),
               "zeroed_tensor", "midlayer.mlp.down_proj.weight all zero"),
    "no_lm_head": (dict(config=lambda c: c.update(tie_word_embeddings=True),
                        weights=lambda w: w.pop("lm_head.weight")),
                   "weights_format", "lm_head.weight"),
    "short_positions": (dict(config=lambda c: c.update(max_position_embeddings=16)),
                        "short_positions", "max_position_embeddings 16 is shorter"),
    "empty_ids": (dict(config=_ids([])), "empty_ids", "is an empty list"),
    "four_ids": (dict(config=_ids([1, 2, 3, 4])), "engine_feed", "fc"),
    "past_last": (dict(config=_ids([1, 2, 9])), "engine_feed", "out of range"),
}


@pytest.fixture(scope="module")
def refusing_run(tiny_run, tmp_path_factory):
    """A copy of the tiny run up to its trained draft (its own serve, evaluate and MLflow store
    left out): the run the refusals below are served in, one after another."""
    import shutil

    run = tmp_path_factory.mktemp("refusing") / "run"
    shutil.copytree(tiny_run, run, ignore=lambda folder, names: [
        n for n in names if Path(folder) == tiny_run and n in ("serve", "evaluate", "mlflow.db")])
    return run


def _serve_through_the_command_line(run, draft, capsys):
    """`python -m workflows.pipeline stages=[serve] serve.draft=DIR run_dir=RUN`, as a user
    types it: its exit status and what it printed."""
    from workflows import pipeline

    capsys.readouterr()
    code = pipeline.main(["experiment=tiny", f"run_dir={run}", "stages=[serve]", "serve=vllm",
                          f"serve.draft={draft}", "serve.num_prompts=2",
                          "serve.max_new_tokens=8", "mlflow.run_name=refused"])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_each_damaged_draft_is_refused_before_any_engine_boots(refusing_run, tmp_path, capsys,
                                                               case):
    """Through the pipeline's command line: exit status 1 and one `eyas:` paragraph naming the
    finding and the tensor or key, no traceback; the report records the findings and that
    nothing booted."""
    edit, finding, words = DAMAGE[case]
    draft = damaged_copy(refusing_run / "train" / "draft", tmp_path / "d", **edit)
    code, printed = _serve_through_the_command_line(refusing_run, draft, capsys)
    assert code == 1, printed[-3000:]
    said = printed[printed.index("eyas: "):]
    assert finding in said and words in " ".join(said.split()), said
    assert "Traceback" not in printed and "Error:" not in said.splitlines()[0], printed[-3000:]
    report = json.loads((refusing_run / "serve" / "report.json").read_text())
    names = [f["name"] for f in report["doctor"]["findings"]]
    assert finding in names, names
    assert "parity_detail" not in report  # nothing booted


def test_a_foreign_draft_with_an_all_zero_d2t_is_refused_through_the_command_line(
        refusing_run, tmp_path, capsys):
    """A speculators checkpoint of the run's draft, its d2t zeroed, handed in by serve.draft=:
    refused by the doctor's checks with one `eyas:` paragraph, exit status 1."""
    from safetensors.torch import load_file, save_file

    from eyas.conventions import vllm
    from eyas.layout import HiddenStateLayout
    from eyas.targets.parts import target_parts
    from foreign_drafts import as_speculators

    trained = refusing_run / "train" / "draft"
    layout = HiddenStateLayout.from_dict(json.loads((trained / "config.json").read_text())[
        "eyas_layout"])
    draft = as_speculators(trained, tmp_path / "spec", vllm.to_ids(layout),
                           target_parts(_target(refusing_run))[0])
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["d2t"] = torch.zeros_like(tensors["d2t"])
    save_file(tensors, str(draft / "model.safetensors"))
    code, printed = _serve_through_the_command_line(refusing_run, draft, capsys)
    assert code == 1, printed[-3000:]
    said = printed[printed.index("eyas: "):]
    assert "d2t_identity" in said and "d2t" in said.split("d2t_identity", 1)[1], said
    assert "Traceback" not in printed


def test_vllm_itself_serves_a_draft_missing_a_tensor(tiny_run, tmp_path):
    """What eyas refuses above, vLLM boots and serves: the dropped tensor is left as
    initialised, without a word."""
    from types import SimpleNamespace

    from safetensors.torch import load_file
    from vllm import SamplingParams

    from eyas.engines.vllm_loaded import held_tensors
    from eyas.draft.directory import read_config
    from eyas.draft.load import speculative_config
    from eyas.engines.vllm_engine import EngineOptions, boot_llm

    draft = damaged_copy(tiny_run / "train" / "draft", tmp_path / "d", **DAMAGE["removed"][0])
    spec = {**speculative_config(read_config(draft)), "model": str(draft),
            "num_speculative_tokens": 3}
    llm = boot_llm(_target(tiny_run), EngineOptions(), speculative_config=spec)
    out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}],
                       SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8
    held, _ = held_tensors(SimpleNamespace(llm=llm))
    trained = load_file(tiny_run / "train" / "draft" / "model.safetensors")
    served = held["model.layers.0.mlp.down_proj.weight"]
    assert served.shape == trained["midlayer.mlp.down_proj.weight"].shape
    assert not torch.allclose(served, trained["midlayer.mlp.down_proj.weight"])
    del llm


def test_a_draft_that_fails_parity_is_refused_through_the_command_line(refusing_run, tmp_path,
                                                                       capsys):
    """A draft from "another trainer" (no eyas layout) whose ids are one block late: the engine
    boots, parity finds it fed other blocks, and the run ends with exit status 1 and one
    `eyas:` paragraph naming them; the report records the failed parity."""
    def shifted(c):
        del c["eyas_layout"]
        _ids([2, 3, 4])(c)

    draft = damaged_copy(refusing_run / "train" / "draft", tmp_path / "d", config=shifted)
    code, printed = _serve_through_the_command_line(refusing_run, draft, capsys)
    assert code == 1, printed[-3000:]
    said = " ".join(printed[printed.index("eyas: "):].split())
    assert "engine feeds [block 1, block 2, block 3]" in said, said
    assert "Traceback" not in printed
    report = json.loads((refusing_run / "serve" / "report.json").read_text())
    assert report["parity"] is False and "engine_version" not in report  # not benchmarked
