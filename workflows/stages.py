"""The stage runners: each runs its stage as Ray work, builds its typed report from what the
work returned and wrote (workflows/reports.py), logs it to its MLflow child run and returns
its rows of the end-of-run summary. `STAGES` declares what each depends on: the config sections
and keys it reads and the stages whose outputs it consumes (workflows/pipeline.py decides from
them whether a stage is up to date)."""
from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray

from eyas.config import PipelineConfig
from eyas.layout import TargetIdentity
from eyas.train import stop
from eyas.run_records import (MANIFEST_FILE, TARGET_FILE, RunDir, TargetRecord, read_target,
                              target_file, write_target)
from eyas import precision
from workflows.config import ConfigError, target_bf16
from workflows.plan import RunPlan
from workflows.reports import (EvaluateStageReport, ExtractStageReport, PrepareStageReport,
                               TrainStageReport, log_report)
from workflows.serve_reports import ServeStageReport
from workflows.tracking import Tracking
from tasks import run_in_actor


@dataclass
class RunState:
    """What earlier stages handed on, and the summary rows printed at the end."""

    cfg: PipelineConfig
    run_dir: Path
    tracking: Tracking
    plan: RunPlan  # the target's shape and the layout, resolved once before any stage
    identity: TargetIdentity | None = None
    target_path: str | None = None
    summary: dict[str, dict[str, object]] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)  # stage -> output fingerprint
    results: dict[str, float] = field(default_factory=dict)  # the parent run's summary row

    @property
    def run(self) -> RunDir:
        return RunDir.of(self.run_dir)


def run_prepare(state: RunState) -> dict:
    from tasks.prepare import follow_prepare

    out = state.run.prepare
    result = follow_prepare(state.cfg, str(out))
    state.identity = TargetIdentity(**result["identity"])
    state.target_path = result["target_path"]
    # later stages find the target by path and identity: what it IS, not whether it was cached
    built = {k: v for k, v in (result["build_report"] or {}).items() if k != "cached"}
    record = write_target(state.run_dir, TargetRecord(result["target_path"], result["identity"],
                                                      built or None))
    report = PrepareStageReport(result["manifest"], result["build_report"], state.identity,
                                state.target_path, (out / MANIFEST_FILE, record))
    # what the target computes in, and why (target.dtype=auto: eyas/precision.py)
    dtype = precision.describe("target.dtype", state.cfg.target.dtype, target_bf16(state.cfg))
    return {**log_report(state.tracking, report), "dtype": dtype}


def resolved_target(state: RunState, required: bool = True) -> tuple[str, TargetIdentity] | None:
    """The target that the prepare stage resolved (this invocation or an earlier one)."""
    if state.identity is None:
        record = read_target(state.run_dir)
        if record is None:
            if not required:
                return None
            raise ConfigError(f"{target_file(state.run_dir)} is missing: run the prepare stage "
                              "first (stages=[prepare,...])")
        if record.build_report:
            _check_builtin(state, record)
        state.identity = TargetIdentity(**record.identity)
        state.target_path = record.target_path
    return state.target_path, state.identity


def _check_builtin(state: RunState, record: TargetRecord) -> None:
    """The built-in target an earlier prepare recorded (its cache is shared, outside the run
    directory): a damaged one is said and rebuilt, and must come back as the one recorded."""
    from eyas.targets.cache import damage
    from tasks.prepare import rebuild_builtin_target_task

    recorded = Path(record.target_path)
    problem = damage(recorded)
    if problem is None:
        return
    print(f"eyas: the cached built-in target {recorded} is damaged ({problem}): rebuilding it",
          file=sys.stderr)
    rebuilt = ray.get(rebuild_builtin_target_task.remote(state.cfg.target))
    if rebuilt["target_path"] != str(recorded) or rebuilt["identity"] != record.identity:
        raise ConfigError(
            f"the built-in target {recorded} that the prepare stage recorded was damaged "
            f"({problem}), and this config builds another one ({rebuilt['target_path']}), or "
            "the rebuild differs from it: the stored data were made with the old one; rerun "
            "from the prepare stage in a new run_dir")


def run_extract(state: RunState) -> dict:
    from eyas.extract import Extraction
    from eyas.progress import progress
    from eyas.targets import load_tokenizer
    from tasks.extract import run_extraction

    cfg = state.cfg
    target_path, identity = resolved_target(state)
    layout = state.plan.layout_on(identity)
    out = state.run.extract
    bar = progress(desc="extract", unit="shard")
    job = Extraction(state.run.prepare, out, layout, load_tokenizer(target_path), cfg.extract,
                     cfg.target.dtype, target_path if cfg.train.source == "online" else None)
    manifest = run_extraction(target_path, job, on_shard=lambda record: bar.update(1))
    bar.close()
    report = ExtractStageReport(manifest, layout.describe(), cfg.train.source, out)
    return log_report(state.tracking, report)


def run_train(state: RunState) -> dict:
    from tasks.train import TrainJob, run_training

    cfg, t = state.cfg, state.tracking
    target_path, _ = resolved_target(state)
    out = state.run.stage("train")
    # the cluster's GPUs, not the driver's: under `ray job submit` it runs on the head
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    online = cfg.train.source == "online"
    feeder = _train_online(state, target_path, out, use_gpu) if online else None
    if not online:
        with checkpoint_at_stop(out):
            run_training(TrainJob(str(state.run.extract), target_path, str(out), cfg.train,
                                  cfg.draft, t.worker_log()), use_gpu)
    return log_report(t, TrainStageReport.read(out, online, feeder))


@contextlib.contextmanager
def checkpoint_at_stop(out: Path):
    """A stop (SIGTERM, Ctrl-C) that reaches the driver while the training workers run asks
    them to checkpoint the step they are on (eyas/train/stop.py) and waits for it, at most
    stop.GRACE_S, before the run unwinds: a resume redoes no finished step."""
    try:
        yield
    except BaseException as e:
        if stop.interrupt_in(e) is None:
            raise
        stop.request(out)
        done = stop.wait(out, stop.GRACE_S)
        print(f"train: checkpointed step {done['step']} as it stopped ({done['checkpoint']})"
              if done else f"train: no checkpoint at the stop within {stop.GRACE_S:.0f} s; a "
              "resume starts from the last periodic one", file=sys.stderr, flush=True)
        raise


def _train_online(state: RunState, target_path: str, out: Path, use_gpu: bool):
    """Train on the target's streamed states (tasks/online.py); its FeederReport or None."""
    from eyas.layout import HiddenStateLayout
    from eyas.targets import load_tokenizer
    from eyas.train.stream import OnlineStream
    from tasks.online import start_stream, stop_stream
    from tasks.train import TrainJob, run_training

    cfg = state.cfg
    extract = state.run.extract
    manifest = json.loads((extract / MANIFEST_FILE).read_text())
    if "online" not in manifest:
        raise ConfigError(f"train.source=online but {extract} is an offline extraction; run the "
                          "extract stage with train.source=online (stages=[extract,train,...])")
    prepare = manifest["online"]["prepare_dir"]
    layout = HiddenStateLayout.from_dict(manifest["layout"])
    feeder, replicas = start_stream(target_path, layout, cfg.extract, cfg.target.dtype,
                                    Path(prepare), cfg.train,
                                    load_tokenizer(target_path).pad_token_id or 0)
    try:
        with checkpoint_at_stop(out):  # while the stream still runs
            run_training(TrainJob(str(extract), target_path, str(out), cfg.train, cfg.draft,
                                  state.tracking.worker_log(),
                                  online=OnlineStream(feeder, layout, prepare,
                                                      manifest["totals"]["train"]["samples"])),
                         use_gpu)
    finally:
        report = stop_stream(feeder, replicas)
    if report is not None:  # None: the feeder was lost (the summary says so)
        report.write(out)
    return report


class StageFailed(RuntimeError):
    """A stage that ran and found a fault it must not log and forget (skew, failed parity)."""


def _draft_dir(state: RunState) -> str:
    return state.cfg.serve.draft or str(state.run.draft)


def run_evaluate(state: RunState) -> dict:
    from tasks.evaluate import EvaluateActor

    cfg = state.cfg
    target_path, _ = resolved_target(state)
    out = state.run.evaluate
    result = run_in_actor(EvaluateActor, str(state.run.extract), _draft_dir(state),
                          target_path, cfg.eval, str(out), cfg.serve.num_speculative_tokens,
                          dict(cfg.serve.prompt_sets), num_cpus=1)
    report = EvaluateStageReport.read(out)
    log_report(state.tracking, report)
    if "alarm" in result:
        raise StageFailed(f"evaluate: the skew doctor found a fault\n{result['alarm']}")
    state.results.update(report.results())
    return report.rows()


def run_serve(state: RunState) -> dict:
    from tasks.serve import ServeActor

    cfg = state.cfg
    target_path, _ = resolved_target(state)
    out = state.run.serve
    draft = _draft_dir(state)
    # the evaluate stage measured this draft (serve.draft too) offline in this run: the gap
    # alarm compares its profiles with the served ones
    offline = str(state.run.evaluate) if state.fingerprints.get("evaluate") else None
    result = run_in_actor(ServeActor, target_path, draft, str(state.run.extract),
                          cfg.serve, str(out), offline, num_cpus=1)
    report = ServeStageReport.read(out, cfg.serve, target_path, draft)
    log_report(state.tracking, report)
    # a failed parity (nothing benchmarked), or the gap alarm (the benchmark logged first)
    if "fault" in result:
        raise StageFailed(f"serve: {result['fault']}")
    state.results.update(report.results())
    if not report.report.benchmark.lossless:
        raise StageFailed("serve: greedy output with the draft differs from the target's alone "
                          "beyond near-ties of the target's own (serve/report.json: partings): "
                          "speculation must be lossless")
    return report.rows()


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[RunState], dict]
    config: tuple[str, ...]  # the config sections and keys the stage reads: its key digests them
    inputs: tuple[str, ...]  # stages whose outputs it consumes
    outputs: tuple[str, ...]  # files under run_dir/<name>/ that fingerprint its output
    online_config: tuple[str, ...] = ()  # read too when train.source=online

    def reads(self, cfg: PipelineConfig) -> tuple[str, ...]:
        return self.config + (self.online_config if cfg.train.source == "online" else ())


STAGES = {
    "prepare": Stage("prepare", run_prepare, ("target", "data"), (), (MANIFEST_FILE, TARGET_FILE)),
    # the target is loaded in target.dtype; online, the probe set and held-out split alone are stored
    "extract": Stage("extract", run_extract, ("extract", "target.dtype", "train.source"),
                     ("prepare",), (MANIFEST_FILE,)),
    # online, the target replicas streaming to the trainer are extract's
    "train": Stage("train", run_train, ("draft", "train"), ("extract",),
                   ("draft/config.json", "draft/model.safetensors"),
                   online_config=("extract", "target.dtype")),
    # the draft is scored at the k it is served with, the foreign one where serve.draft names it
    "evaluate": Stage("evaluate", run_evaluate, ("eval", "serve.draft",
                      "serve.num_speculative_tokens", "serve.prompt_sets"), ("train",),
                      ("report.json",)),
    "serve": Stage("serve", run_serve, ("serve",), ("train",), ("report.json",)),
}

