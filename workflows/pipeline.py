"""The eyas pipeline: `python -m workflows.pipeline [GROUP=CHOICE] [key=value ...]`.

Runs the configured stages in order, each as Ray work, under one MLflow parent run with one
child run per stage. On a laptop Ray starts locally; under `ray job submit` it joins the
cluster. Outputs go to the absolute `run_dir`.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray

from eyas.config import STAGES, PipelineConfig
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity
from workflows.config import ConfigError, flatten, load_config, to_yaml
from workflows.tracking import Tracking, git_commit


@dataclass
class RunState:
    """What earlier stages handed on, and the summary rows printed at the end."""

    cfg: PipelineConfig
    run_dir: Path
    tracking: Tracking
    identity: TargetIdentity | None = None
    target_path: str | None = None
    summary: dict[str, dict[str, object]] = field(default_factory=dict)


def run_prepare(state: RunState) -> None:
    from tasks.prepare import prepare_task

    out = state.run_dir / "prepare"
    result = ray.get(prepare_task.remote(state.cfg, str(out)))
    state.identity = TargetIdentity(**result["identity"])
    state.target_path = result["target_path"]
    manifest = result["manifest"]
    # later stages find the target here, by path and by identity
    (out / "target.json").write_text(json.dumps(
        {k: result[k] for k in ("target_path", "identity", "build_report")}, indent=2))
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
    state.summary["prepare"] = rows


def _target(state: RunState) -> tuple[str, TargetIdentity]:
    """The target that the prepare stage resolved (this invocation or an earlier one)."""
    if state.identity is None:
        path = state.run_dir / "prepare" / "target.json"
        if not path.exists():
            raise ConfigError(f"{path} is missing: run the prepare stage first "
                              "(stages=[prepare,...])")
        info = json.loads(path.read_text())
        state.identity, state.target_path = TargetIdentity(**info["identity"]), info["target_path"]
    return state.target_path, state.identity


def run_extract(state: RunState) -> None:
    from tqdm.auto import tqdm

    from eyas.target import load_tokenizer
    from tasks.extract import run_extraction
    from workflows.plots import norm_fingerprints

    cfg, t = state.cfg, state.tracking
    target_path, identity = _target(state)
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
    state.summary["extract"] = {
        "data": f"{len(manifest['shards'])} shards, {manifest['totals']['train']['tokens']} "
                f"train tokens, {manifest['tokens_per_s']:.0f} tokens/s",
        "norms": ", ".join(f"{k} {v[0]:.3g}" for k, v in norms.items())}


RUNNERS = {"prepare": run_prepare, "extract": run_extract}


def _layout_tags(cfg: PipelineConfig, identity: TargetIdentity) -> dict[str, str]:
    """Resolve the extraction layout against the target as early as possible."""
    from eyas.fingerprint import json_digest

    layout = HiddenStateLayout.from_names(identity, cfg.extract.layout.draft_inputs,
                                          cfg.extract.layout.verifier)
    return {"eyas.layout": layout.describe(),
            "eyas.layout_fingerprint": json_digest(layout.to_dict() | {"norms": {}})}


def run(cfg: PipelineConfig) -> RunState:
    missing = [s for s in cfg.stages if s not in RUNNERS]
    if missing:
        raise ConfigError(f"stages {missing} are not available in this version of eyas "
                          f"(available: {', '.join(RUNNERS)})")
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    tracking = Tracking(cfg.mlflow.tracking_uri, cfg.mlflow.experiment, run_dir)
    state = RunState(cfg, run_dir, tracking)
    name = cfg.mlflow.run_name or f"{Path(cfg.target.path or 'builtin').name}-" \
                                  f"{time.strftime('%Y%m%d-%H%M%S')}"
    tags = {"eyas.git_commit": git_commit(), "eyas.run_dir": str(run_dir),
            "eyas.stages": ",".join(cfg.stages)}
    with tracking.parent(name, flatten(cfg), tags) as parent:
        tracking.log_file(run_dir / "config.yaml")
        for stage in (s for s in STAGES if s in cfg.stages):
            started = time.time()
            with tracking.stage(stage, f"{name}/{stage}"):
                RUNNERS[stage](state)
                tracking.log_metrics({"stage_seconds": time.time() - started})
            if state.identity is not None:
                tracking.set_tags({"eyas.target_fingerprint": state.identity.fingerprint},
                                  parent.info.run_id)
                try:
                    tracking.set_tags(_layout_tags(cfg, state.identity), parent.info.run_id)
                except LayoutError as e:
                    if any(s in cfg.stages for s in STAGES[1:]):
                        raise
                    tracking.set_tags({"eyas.layout": f"unresolved: {e}"}, parent.info.run_id)
        summary = _summary_table(state.summary)
        tracking.log_json(state.summary, "summary.json")
    print(summary)
    print(f"\nrun directory: {run_dir}\nMLflow: mlflow ui --backend-store-uri {tracking.uri}")
    return state


def _summary_table(summary: dict[str, dict[str, object]]) -> str:
    lines = ["", "stage      | item     | result", "-" * 72]
    for stage, rows in summary.items():
        for item, value in rows.items():
            lines.append(f"{stage:<10} | {item:<8} | {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"eyas: config error: {e}", file=sys.stderr)
        return 2
    started_ray = not ray.is_initialized()
    if started_ray:  # joins RAY_ADDRESS / a `ray job submit` cluster, else starts a local one
        ray.init(log_to_driver=True)
    try:
        run(cfg)
    except (ConfigError, LayoutError) as e:
        print(f"eyas: {e}", file=sys.stderr)
        return 2
    finally:
        if started_ray:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
