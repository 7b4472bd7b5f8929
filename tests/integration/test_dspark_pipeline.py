"""DSpark through the command a user types, on the tiny target: `eyas run draft.family=dspark`
trains and evaluates it on the tiny run's data (its prepare and extract stages reused), and
`eyas export` writes it as vLLM's V2 runner loads it. Serving it needs a GPU (vLLM's CPU build
runs the V1 runner, which has no DSpark): tests/gpu/test_dspark_vllm.py."""
from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.integration

BLOCK = 3  # the tiny experiment serves k = 3: a DSpark block of 3 drafts 3 tokens


def test_dspark_trains_evaluates_and_exports_through_eyas_run(tiny_run, target_cache, tmp_path):
    from eyas import cli
    from eyas.run_records import target_path
    from workflows import pipeline

    run = tmp_path / "run"
    run.mkdir()
    for stage in ("prepare", "extract"):  # the tiny run's data: only train and evaluate run
        shutil.copytree(tiny_run / stage, run / stage)
    for record in tiny_run.glob("*.json"):
        shutil.copy(record, run / record.name)
    code = pipeline.main(["experiment=tiny", f"run_dir={run}", "serve=vllm",
                          "extract.dtype=bfloat16", f"target.builtin.cache_dir={target_cache}",
                          "draft.family=dspark", "stages=[prepare,extract,train,evaluate]",
                          "mlflow.run_name=tiny-dspark"])
    assert code == 0
    for stage in ("prepare", "extract"):  # reused, not redone
        assert (json.loads((run / stage / "_COMPLETE.json").read_text())["finished_at"]
                == json.loads((tiny_run / stage / "_COMPLETE.json").read_text())["finished_at"])
    config = json.loads((run / "train" / "draft" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["block_size"] == BLOCK
    report = json.loads((run / "train" / "train_report.json").read_text())
    assert report["losses"][-1] < report["losses"][0]
    evaluated = json.loads((run / "evaluate" / "report.json").read_text())
    # every slot of the block drafts: as many positions scored as the block holds
    heldout = evaluated["per_position_accuracy"]["heldout"]
    assert len(heldout["in_vocab"]) == BLOCK and evaluated["predicted_tau"]["heldout"] >= 1.0

    out = tmp_path / "export"
    assert cli.main(["export", f"draft={run / 'train' / 'draft'}", f"target={target_path(run)}",
                     f"out={out}", f"num_speculative_tokens={BLOCK}"]) == 0
    exported = json.loads((out / "vllm" / "config.json").read_text())
    assert exported["architectures"] == ["Qwen3DSparkModel"] and exported["markov_rank"] > 0
