"""The pipeline end to end on a real local Ray cluster with a real MLflow sqlite store."""
import json

import mlflow
import pyarrow.parquet as pq
import pytest

from eyas.conversations.prepare import check_tokenizer_matches
from eyas.doctor.profile import read_profile
from helpers import read_prepared
from eyas.targets import load_tokenizer
from workflows import pipeline

pytestmark = pytest.mark.integration


def test_prepare_outputs(tiny_run):
    manifest = json.loads((tiny_run / "prepare" / "manifest.json").read_text())
    train, meta = read_prepared(tiny_run / "prepare" / "train.parquet")
    assert train.num_rows == manifest["splits"]["train"]["samples"] > 0
    heldout = pq.read_table(tiny_run / "prepare" / "heldout.parquet")
    assert heldout.num_rows == manifest["splits"]["heldout"]["samples"] > 0
    train_sources = set(manifest["demo"]["train_sources"])
    assert train_sources and not train_sources & set(manifest["demo"]["heldout_sources"])
    for ids, mask in zip(train.column("input_ids").to_pylist(),
                         train.column("loss_mask").to_pylist()):
        assert len(ids) == len(mask) <= 512 and 0 < sum(mask) < len(mask)
    target = json.loads((tiny_run / "prepare" / "target.json").read_text())
    assert target["identity"]["num_layers"] == 4
    assert target["build_report"]["heldout_loss"] < target["build_report"]["unigram_loss"]
    check_tokenizer_matches(meta, load_tokenizer(target["target_path"]))
    assert "extract:" in (tiny_run / "config.yaml").read_text()


def test_mlflow_parent_and_stage_runs(tiny_run):
    mlflow.set_tracking_uri(f"sqlite:///{tiny_run / 'mlflow.db'}")
    exp = mlflow.get_experiment_by_name("eyas")
    runs = mlflow.search_runs([exp.experiment_id], output_format="list")
    parent = next(r for r in runs if r.info.run_name == "tiny-it")
    child = next(r for r in runs if r.info.run_name == "tiny-it/prepare")
    extract = next(r for r in runs if r.info.run_name == "tiny-it/extract")
    assert extract.data.tags["mlflow.parentRunId"] == parent.info.run_id
    em = extract.data.metrics
    assert em["shards"] >= 2 and em["tokens_per_s"] > 0 and em["bytes_over_raw"] < 1.1
    assert {"norm.block_out:0.mean", "norm.block_out:3.std"} <= set(em)
    extract_artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(
        extract.info.run_id, "extract")}
    assert "extract/norm_fingerprints.png" in extract_artifacts
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags["eyas.stage"] == "prepare"
    assert parent.data.params["target.builtin.hidden_size"] == "64"
    assert parent.data.params["extract.layout.draft_inputs"] == \
        "['block_out:0', 'block_out:1', 'block_out:2']"
    tags = parent.data.tags
    assert len(tags["eyas.git_commit"]) in (40, 7) or tags["eyas.git_commit"] == "unknown"
    assert tags["eyas.target_fingerprint"] == child.data.tags["eyas.target_fingerprint"]
    assert tags["eyas.layout"].startswith("LlamaForCausalLM with 4 blocks")
    assert len(tags["eyas.layout_fingerprint"]) == 16
    metrics = child.data.metrics
    manifest = json.loads((tiny_run / "prepare" / "manifest.json").read_text())
    assert metrics["train.samples"] == manifest["splits"]["train"]["samples"]
    assert metrics["target.heldout_loss"] < metrics["target.unigram_loss"]
    assert metrics["target.num_parameters"] > 100_000
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(child.info.run_id)}
    assert {"prepare", "target"} <= artifacts
    stage = {s: next(r for r in runs if r.info.run_name == f"tiny-it/{s}")
             for s in ("train", "evaluate", "serve")}
    assert stage["train"].data.metrics["heldout.acc_step0"] > 0
    # no fault; on the tiny target's 4 probe samples the evidence may not decide every
    # alternative, and then the doctor says so instead of OK
    evaluated = json.loads((tiny_run / "evaluate" / "report.json").read_text())["doctor"]
    assert not evaluated["findings"]
    assert stage["evaluate"].data.tags["eyas.doctor"] == (
        "inconclusive" if evaluated["inconclusive"] else "ok")
    assert stage["serve"].data.tags["eyas.parity"] == "ok"
    assert stage["serve"].data.metrics["lossless"] == 1.0
    # the parent's summary row is what the stages measured, not a placeholder
    evaluate = json.loads((tiny_run / "evaluate" / "report.json").read_text())
    serve = json.loads((tiny_run / "serve" / "report.json").read_text())
    summary = parent.data.metrics
    assert summary["summary.predicted_tau"] == pytest.approx(evaluate["predicted_tau"]["heldout"])
    assert summary["summary.reference_tau"] == pytest.approx(evaluate["measured_tau"])
    assert summary["summary.vllm_tau"] == pytest.approx(serve["tau"])
    assert summary["summary.speedup"] == pytest.approx(serve["speedup"])
    assert summary["summary.latency_ratio"] == pytest.approx(serve["latency_ratio"])
    # the latency sweep: concurrency 1 (the headline) and the configured levels, each lossless
    assert [p["concurrency"] for p in serve["sweep"]] == [1, 4, 16]
    assert serve["sweep"][0]["ratio"] == serve["latency_ratio"] and serve["sweep"][0]["requests"] == 4
    # concurrency 1 served A/B/B/A by two engines alive together, the ratio with its interval
    assert serve["sweep"][0]["interleaved"] and not serve["sweep"][1]["interleaved"]
    low, high = serve["sweep"][0]["ratio_interval"]
    assert low <= serve["latency_ratio"] <= high and low < high
    assert all(p["lossless"] and p["tau"] > 1.0 for p in serve["sweep"])
    metrics = stage["serve"].data.metrics
    assert metrics["concurrency16.ratio"] == pytest.approx(serve["sweep"][2]["ratio"])
    low, high = serve["acceptance"]["tau_interval"]  # 95 %, from the accepted lengths
    assert (metrics["tau_low"], metrics["tau_high"]) == pytest.approx((low, high))
    assert low <= serve["tau"] <= high
    serve_files = {a.path for a in mlflow.MlflowClient().list_artifacts(
        stage["serve"].info.run_id, "serve")}
    assert "serve/concurrency_sweep.png" in serve_files
    assert serve["tau"] > 1.0  # the trained draft's proposals are accepted at times
    # vLLM bench serve's names per concurrency, the served profile, and the gap alarm quiet
    point = serve["sweep"][0]
    assert {"mean_ttft_ms", "p99_tpot_ms", "median_itl_ms", "p90_e2el_ms"} <= set(
        point["with_draft"]) and point["spec_decode"]["spec_decode_acceptance_length"] == \
        pytest.approx(serve["tau"])
    assert metrics["sets.heldout.c16.spec.p99_tpot_ms"] == pytest.approx(
        serve["sweep"][2]["with_draft"]["p99_tpot_ms"])
    assert "serve/tau_per_set.png" in serve_files
    for stage_dir in ("evaluate", "serve"):
        profile = read_profile(tiny_run / stage_dir / "speculation_profile.json")
        assert profile["measurement_conditions"]["dataset"] == "heldout"
    assert serve["gap"]["compared"] == ["heldout"] and serve["gap"]["findings"] == []
    assert stage["serve"].data.tags["eyas.gap"] == "ok"


def test_bf16_states_pass_parity_within_their_dtype(tiny_run):
    manifest = json.loads((tiny_run / "extract" / "manifest.json").read_text())
    assert manifest["dtype"] == "bfloat16"
    serve = json.loads((tiny_run / "serve" / "report.json").read_text())
    parity = serve["parity_detail"]
    assert serve["engine"] == "vllm" and serve["parity"] is True and parity["applicable"]
    # bf16 rounding alone exceeds float32's 1e-3; the tolerance allows three times its bound
    # (3 x (1e-3 + 3.9e-3): float32 in the extraction and the engine walk no further), no more
    assert 1e-3 < parity["worst_error"] <= parity["tolerance"] < 1.5e-2
    assert parity["fed"] == parity["trained"] == ["block_out:0", "block_out:1", "block_out:2"]


def test_config_error_stops_before_work(ray_cluster, tmp_path, capsys):
    assert pipeline.main(["trian.lr=1", f"run_dir={tmp_path}"]) == 2
    assert "did you mean 'train'" in capsys.readouterr().err
    assert not (tmp_path / "mlflow.db").exists()


def test_rerun_skips_done_stages_and_redoes_invalidated(ray_cluster, target_cache, tmp_path,
                                                        capsys):
    run_dir = tmp_path / "run"
    args = ["experiment=tiny", f"run_dir={run_dir}", "stages=[prepare,extract,train]",
            f"target.builtin.cache_dir={target_cache}", "extract.probe_samples=0",
            "train.epochs=1"]
    assert pipeline.main(args + ["mlflow.run_name=first"]) == 0
    marker = lambda s: json.loads((run_dir / s / "_COMPLETE.json").read_text())  # noqa: E731
    stages = ("prepare", "extract", "train")
    first = {s: marker(s) for s in stages}
    assert pipeline.main(args + ["mlflow.run_name=again"]) == 0
    assert {s: marker(s) for s in stages} == first  # nothing redone
    assert pipeline.main(args + ["train.lr=1e-3", "mlflow.run_name=changed"]) == 0
    assert marker("prepare") == first["prepare"] and marker("extract") == first["extract"]
    assert marker("train")["key"] != first["train"]["key"]
    mlflow.set_tracking_uri(f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in mlflow.search_runs(
        [mlflow.get_experiment_by_name("eyas").experiment_id], output_format="list")}
    for stage in stages:
        assert runs[f"again/{stage}"].data.tags["eyas.skipped"] == "up to date"
    assert runs["changed/prepare"].data.tags["eyas.skipped"] == "up to date"
    assert runs["changed/extract"].data.tags["eyas.skipped"] == "up to date"
    assert "eyas.skipped" not in runs["changed/train"].data.tags
    assert runs["changed"].data.params["train.lr"] == "0.001"
    assert runs["changed/train"].data.tags["eyas.input.extract"] == \
        runs["first/extract"].data.tags["eyas.output_fingerprint"]
    # an extract override redoes extract (old shards not reused; kept aside until it is done)
    extract_args = [a for a in args if not a.startswith("stages")] + [
        "stages=[prepare,extract]", "extract.samples_per_shard=5"]
    assert pipeline.main(extract_args) == 0
    assert marker("prepare") == first["prepare"]
    shards = json.loads((run_dir / "extract" / "manifest.json").read_text())["shards"]
    assert len(shards) > 3 and all(s["samples"] <= 5 for s in shards)
    assert not (run_dir / "extract.previous").exists()
    # a damaged upstream: named when its stage is not run, redone when it is
    split = run_dir / "prepare" / "heldout.parquet"
    intact = split.read_bytes()
    split.write_bytes(intact[:-50])
    capsys.readouterr()
    assert pipeline.main([a for a in extract_args if not a.startswith("stages")]
                         + ["stages=[extract]"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"heldout.parquet: {len(intact) - 50} bytes, {len(intact)} when written" in err
            and "add prepare to the stages" in err), err
    extract_done = marker("extract")
    assert pipeline.main(extract_args) == 0
    assert split.read_bytes() == intact  # prepare redone, to the same bytes...
    assert marker("extract") == extract_done  # ...so extract stays done


@pytest.mark.parametrize("typo", ["extract.layout.draft_inputs=[block_out:0,block_out:9]",
                                  "extract.layout.draft_inputs=[block_out:0,blockout:1]",
                                  "extract.samples_per_shard=0", "train.batch_size=-3",
                                  "serve.num_speculative_tokens=100"])
def test_a_typo_never_touches_a_finished_run(tiny_run, target_cache, typo, capsys):
    files = lambda: {p: p.stat().st_mtime_ns for p in tiny_run.rglob("*")  # noqa: E731
                     if p.is_file() and p.name != "mlflow.db"}
    before = files()
    code = pipeline.main(["experiment=tiny", f"run_dir={tiny_run}", "serve=vllm",
                          "extract.dtype=bfloat16", f"target.builtin.cache_dir={target_cache}",
                          typo])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("eyas: ") and typo.split("=")[0] in err, err
    assert files() == before  # not one file of the finished run written, moved or removed


def test_a_second_run_on_a_held_run_dir_is_refused(ray_cluster, target_cache, tmp_path,
                                                   capsys):
    import os

    from workflows.run_dir import LOCK, RunDirLock

    run_dir = tmp_path / "run"
    with RunDirLock(run_dir):  # a first run holds it (another open file description)
        code = pipeline.main(["experiment=tiny", f"run_dir={run_dir}", "stages=[prepare]",
                              f"target.builtin.cache_dir={target_cache}"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert f"run_dir={run_dir} is in use by another eyas run: pid {os.getpid()} on " in err, err
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]  # no config.yaml, no MLflow store


@pytest.mark.parametrize("family", ["dflash", "peagle", "eagle3.1"])
def test_every_draft_family_runs_the_pipeline(tiny_run, target_cache, tmp_path, family):
    """draft.family=F on a copy of the tiny run: its prepared and extracted data are reused
    (one extraction feeds every family), and train, evaluate and serve run for the family:
    vLLM serves the draft with the method its family needs, parity proven on the slots the
    family's writer compiled into its own key, losslessly, drafts accepted, and the gap alarm
    quiet: served acceptance per position within its noise of the offline measurement."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    marker = lambda s: json.loads((run_dir / s / "_COMPLETE.json").read_text())  # noqa: E731
    before = {s: marker(s) for s in ("prepare", "extract")}
    assert pipeline.main(["experiment=tiny", f"run_dir={run_dir}", "serve=vllm",
                          "extract.dtype=bfloat16", f"target.builtin.cache_dir={target_cache}",
                          f"draft.family={family}", f"mlflow.run_name=tiny-{family}",
                          "serve.concurrency=[1,4]"]) == 0
    assert {s: marker(s) for s in ("prepare", "extract")} == before
    config = json.loads((run_dir / "train" / "draft" / "config.json").read_text())
    assert config["eyas_family"] == family
    evaluate = json.loads((run_dir / "evaluate" / "report.json").read_text())
    serve = json.loads((run_dir / "serve" / "report.json").read_text())
    assert serve["parity"] is True
    assert serve["parity_detail"]["fed"] == ["block_out:0", "block_out:1", "block_out:2"]
    assert serve["lossless"] and all(p["lossless"] for p in serve["sweep"])
    assert serve["tau"] > 1.0
    # served within the gap alarm's band of the evaluate stage's measurement, per position
    assert serve["gap"]["compared"] == ["heldout"] and serve["gap"]["findings"] == []
    print(f"{family}: predicted tau {evaluate['predicted_tau']['heldout']:.2f}, "
          f"served {serve['tau']:.2f}")


def test_auto_dtype_runs_float32_where_bfloat16_is_not_native_and_the_summary_says_why(
        ray_cluster, target_cache, tmp_path, capsys, monkeypatch):
    """target.dtype=auto (what target=smollm2 and target=local set) on a CPU whose matmuls have
    no bfloat16 instructions (oneDNN capped at AVX2: an AVX2-only EPYC's case): the run computes
    in float32, its recorded config says so, and the prepare summary says why."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    code = pipeline.main(["experiment=tiny", f"run_dir={tmp_path}", "stages=[prepare]",
                          "target.dtype=auto", f"target.builtin.cache_dir={target_cache}"])
    printed = capsys.readouterr().out
    assert code == 0
    row = next(line for line in printed.splitlines() if line.startswith("prepare    | dtype"))
    assert "target.dtype float32: this CPU" in row and "has no native bfloat16" in row, row
    assert "ONEDNN_MAX_CPU_ISA" in row
    recorded = (tmp_path / "config.yaml").read_text()
    assert "  dtype: float32\n" in recorded.split("target:", 1)[1].split("data:", 1)[0]
