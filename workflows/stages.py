"""The stage runners: each runs its stage as Ray work, logs to its MLflow child run, and
returns the rows of the end-of-run summary. What a stage depends on is declared in `STAGES`:
the config sections it reads and the stages whose outputs it consumes (see workflows/pipeline.py
for how that decides whether a stage is up to date).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import ray

from eyas.config import PipelineConfig
from eyas.layout import HiddenStateLayout, TargetIdentity
from workflows.config import ConfigError
from workflows.tracking import Tracking


@dataclass
class RunState:
    """What earlier stages handed on, and the summary rows printed at the end."""

    cfg: PipelineConfig
    run_dir: Path
    tracking: Tracking
    identity: TargetIdentity | None = None
    target_path: str | None = None
    summary: dict[str, dict[str, object]] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)  # stage -> output fingerprint


def run_prepare(state: RunState) -> dict:
    from tasks.prepare import prepare_task

    out = state.run_dir / "prepare"
    result = ray.get(prepare_task.remote(state.cfg, str(out)))
    state.identity = TargetIdentity(**result["identity"])
    state.target_path = result["target_path"]
    manifest = result["manifest"]
    # later stages find the target here, by path and by identity (part of prepare's output
    # fingerprint, so only what the target IS goes in: not whether it came from the cache)
    report = {k: v for k, v in (result["build_report"] or {}).items() if k != "cached"}
    (out / "target.json").write_text(json.dumps(
        {"target_path": result["target_path"], "identity": result["identity"],
         "build_report": report or None}, indent=2, sort_keys=True))
    t = state.tracking
    t.set_tags({"eyas.target_fingerprint": state.identity.fingerprint,
                "eyas.target_path": state.target_path})
    rows = {}
    for split, stats in manifest["splits"].items():
        t.log_metrics({k: v for k, v in stats.items() if not isinstance(v, dict)}, f"{split}.")
        skipped = stats.get("skipped") or {}
        t.log_metrics({f"skipped.{reason}": n for reason, n in skipped.items()}, f"{split}.")
        rows[split] = f"{stats.get('samples')} samples, {stats.get('tokens')} tokens"
    report = result["build_report"]
    if report:
        t.log_metrics({k: report[k] for k in ("heldout_loss", "unigram_loss", "num_parameters",
                                               "build_seconds") if k in report}, "target.")
        t.log_json(report, "target/eyas_build.json")
        rows["target"] = (f"held-out loss {report['heldout_loss']:.3f} vs unigram "
                          f"{report['unigram_loss']:.3f} nats/token, "
                          f"{report['num_parameters'] / 1e6:.2f}M params")
    t.log_file(out / "manifest.json", "prepare")
    t.log_file(out / "target.json", "prepare")
    return rows


def resolved_target(state: RunState, required: bool = True) -> tuple[str, TargetIdentity] | None:
    """The target that the prepare stage resolved (this invocation or an earlier one)."""
    if state.identity is None:
        path = state.run_dir / "prepare" / "target.json"
        if not path.exists():
            if not required:
                return None
            raise ConfigError(f"{path} is missing: run the prepare stage first "
                              "(stages=[prepare,...])")
        info = json.loads(path.read_text())
        state.identity, state.target_path = TargetIdentity(**info["identity"]), info["target_path"]
    return state.target_path, state.identity


def run_extract(state: RunState) -> dict:
    from tqdm.auto import tqdm

    from eyas.target import load_tokenizer
    from tasks.extract import run_extraction
    from workflows.plots import norm_fingerprints

    cfg, t = state.cfg, state.tracking
    target_path, identity = resolved_target(state)
    layout = HiddenStateLayout.from_names(identity, cfg.extract.layout.draft_inputs,
                                          cfg.extract.layout.verifier)
    out = state.run_dir / "extract"
    bar = tqdm(desc="extract", unit="shard")
    manifest = run_extraction(target_path, layout, cfg.extract, cfg.target.dtype,
                              state.run_dir / "prepare", out, load_tokenizer(target_path),
                              on_shard=lambda record: bar.update(1))
    bar.close()
    norms = manifest["layout"]["norms"]
    t.log_metrics({"tokens_per_s": manifest["tokens_per_s"], "bytes": manifest["bytes"],
                   "tensor_bytes": manifest["tensor_bytes"], "shards": len(manifest["shards"]),
                   "resumed_shards": manifest["resumed_shards"],
                   "bytes_over_raw": manifest["bytes"] / max(1, manifest["tensor_bytes"]),
                   **{f"{split}.{k}": v for split, tot in manifest["totals"].items()
                      for k, v in tot.items()}})
    t.log_metrics({f"norm.{slot}.{stat}": value for slot, (mean, std) in norms.items()
                   for stat, value in (("mean", mean), ("std", std))})
    t.log_figure(norm_fingerprints(norms, layout.describe()), "extract/norm_fingerprints.png")
    t.log_json(manifest["layout"], "extract/layout.json")
    t.log_file(out / "manifest.json", "extract")
    return {
        "data": f"{len(manifest['shards'])} shards, {manifest['totals']['train']['tokens']} "
                f"train tokens, {manifest['tokens_per_s']:.0f} tokens/s",
        "norms": ", ".join(f"{k} {v[0]:.3g}" for k, v in norms.items())}


def run_train(state: RunState) -> dict:
    import mlflow

    from tasks.train import run_training

    cfg, t = state.cfg, state.tracking
    target_path, _ = resolved_target(state)
    out = state.run_dir / "train"
    run_training(state.run_dir / "extract", target_path, out, cfg.train, cfg.draft, t.uri,
                 mlflow.active_run().info.run_id,
                 # the cluster's GPUs, not the driver's: under `ray job submit` it runs on the head
                 use_gpu=ray.cluster_resources().get("GPU", 0) > 0)
    report = json.loads((out / "train_report.json").read_text())
    t.log_metrics({"tokens_per_s": report["tokens_per_s"], "steps": report["steps"],
                   **{f"train.acc_step{k}": a for k, a in enumerate(report["train_accuracy"])},
                   **{f"heldout.acc_step{k}": a
                      for k, a in enumerate(report["heldout_accuracy"])},
                   **{f"heldout.full_acc_step{k}": a
                      for k, a in enumerate(report["heldout_full_accuracy"])}})
    t.log_file(out / "draft" / "config.json", "draft")
    t.log_file(out / "train_report.json", "train")
    fmt = lambda accs: " ".join(f"{a:.2f}" for a in accs)  # noqa: E731
    return {"draft": report["draft_dir"],
            "accuracy": f"per TTT step, held-out {fmt(report['heldout_accuracy'])}; "
                        f"train {fmt(report['train_accuracy'])}",
            "speed": f"{report['steps']} steps, {report['tokens_per_s']:.0f} tokens/s"}


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[RunState], dict]
    config: tuple[str, ...]  # config sections the stage reads
    inputs: tuple[str, ...]  # stages whose outputs it consumes
    outputs: tuple[str, ...]  # files under run_dir/<name>/ that fingerprint its output


STAGES = {
    "prepare": Stage("prepare", run_prepare, ("target", "data"), (), ("manifest.json", "target.json")),
    "extract": Stage("extract", run_extract, ("extract",), ("prepare",), ("manifest.json",)),
    "train": Stage("train", run_train, ("draft", "train"), ("extract",),
                   ("draft/config.json", "draft/model.safetensors")),
}
