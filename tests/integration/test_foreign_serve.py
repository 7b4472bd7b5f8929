"""Drafts other tools wrote, served: a speculators checkpoint of the tiny run's draft is
compared with the run's own by `eyas compare`, each with parity proven; one with an all-zero
d2t is refused by the doctor's checks before any engine boots."""
import json
import shutil

import mlflow
import pytest
import torch
from foreign_drafts import as_speculators
from helpers import vllm_installed
from safetensors.torch import load_file, save_file

from eyas.config import ServeConfig
from eyas.conventions import vllm
from eyas.doctor.profile import profile_file, read_profile
from eyas.layout import HiddenStateLayout
from eyas.serve.run import DraftRefused, serve_run
from eyas.targets.parts import target_parts
from workflows import compare

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


def test_compare_serves_the_runs_draft_a_foreign_one_and_the_baseline_on_a_chat_file(
        tiny_run, tmp_path, capsys):
    """`eyas compare`: the run's draft and a speculators checkpoint of it (ids only at the top
    level, as speculators writes them: right on vLLM 0.32; parity proven, as the doctor says)
    beside the target alone, on the held-out split and a user's JSONL chats replayed turn by
    turn; one table, each draft's report and profiles, an MLflow parent with a child each."""
    run = tmp_path / "run"  # a copy: the session's run and its MLflow store stay as they were
    shutil.copytree(tiny_run, run)
    from eyas.run_records import target_path
    target = target_path(run)
    trained = run / "train" / "draft"
    layout = HiddenStateLayout.from_dict(json.loads((trained / "config.json").read_text())[
        "eyas_layout"])
    theirs = as_speculators(trained, tmp_path / "spec", vllm.to_ids(layout),
                            target_parts(target)[0])
    chats = tmp_path / "chats.jsonl"
    chats.write_text("\n".join(json.dumps(r) for r in [
        {"messages": [{"role": "user", "content": "Continue this code:\nimport os\n"},
                      {"role": "assistant", "content": "import sys"},
                      {"role": "user", "content": "Continue."}]},
        {"turns": ["def main():\n", "And the tests?"]},
        {"prompt": "never served: serve.num_prompts=2"}]) + "\n")
    code = compare.main([f"run_dir={run}", f"draft.theirs={theirs}", f"serve.prompt_sets.chat={chats}",
                         "serve.num_prompts=2", "serve.max_new_tokens=8",
                         "serve.concurrency=[1,2]"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "### heldout" in printed and "### chat" in printed
    assert "| target alone |" in printed and "| run |" in printed and "| theirs |" in printed
    out = run / "compare"
    for name in ("run", "theirs"):
        report = json.loads((out / name / "report.json").read_text())
        assert report["parity"] is True, report["parity_detail"]["message"]
        assert report["lossless"] and report["tau"] > 1.0
        sets = {s["name"]: s for s in report["prompt_sets"]}
        assert list(sets) == ["heldout", "chat"]
        assert [p["requests"] for p in sets["chat"]["sweep"]] == [4, 4]  # 2 chats x 2 turns
        assert {"mean_ttft_ms", "p99_itl_ms"} <= set(sets["chat"]["sweep"][1]["with_draft"])
        for set_name in sets:
            assert read_profile(out / name / profile_file(set_name))["method"] == "eagle3"
    assert json.loads((out / "theirs" / "report.json").read_text())["doctor"]["format"] == \
        "speculators"
    # the same chats with and without each draft: the answers replayed are the target's own
    mlflow.set_tracking_uri(f"sqlite:///{run / 'mlflow.db'}")
    runs = mlflow.search_runs([mlflow.get_experiment_by_name("eyas").experiment_id],
                              output_format="list")
    parent = next(r for r in runs if r.info.run_name.startswith("compare "))
    children = {r.info.run_name: r for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(children) == {"run", "theirs"}
    theirs = json.loads((out / "theirs" / "report.json").read_text())["prompt_sets"][1]
    assert theirs["acceptance"]["drafts"] > 0  # (the tiny draft, trained on blank lines,
    # has its drafts rejected on code chats: tau 1.0 there)
    assert children["theirs"].data.metrics["sets.chat.tau"] == pytest.approx(
        theirs["sweep"][0]["tau"])
