"""The eyas pipeline: `eyas run [GROUP=CHOICE] [key=value ...] [--debug]`, or from a checkout
(as `ray job submit` runs it) `python -m workflows.pipeline [GROUP=CHOICE] [key=value ...]`.

Runs the configured stages in order, each as Ray work, under one MLflow parent run with one
child run per stage. On a laptop Ray starts locally; under `ray job submit` it joins the
cluster. Outputs go to the absolute `run_dir`.

Resuming: a finished stage leaves `run_dir/<stage>/_COMPLETE.json` holding its key, a digest
of the config sections and keys it reads (`Stage.config` in workflows/stages.py, nothing
else: `serve.concurrency` does not redo evaluation) and of the output fingerprints of the
stages it consumes. A re-run skips a stage whose key is unchanged and whose outputs are
intact; a changed override changes the key of each stage that reads it, and its new outputs
change the keys of the stages after it, while the stages before it stay done. A damaged
output is redone, reusing its intact parts; the stage's MLflow run (tag `eyas.repaired`) and
the summary name the damaged files.

One run writes a run directory at a time, and finished work is moved aside, not deleted,
until what replaces it is complete: see workflows/run_dir.py.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import ray

from eyas.config import PipelineConfig
from eyas.fingerprint import digest, json_digest
from eyas.layout import LayoutError
from eyas.progress import DEBUG_ENV, QUIET_ENV
from eyas.train.stop import interrupt_in
from workflows.config import ConfigError, flatten, load_config, to_yaml, usage
from workflows.plan import RunPlan, preflight
from workflows.errors import debug_requested, explain
from workflows.stages import STAGES, RunState, Stage, resolved_target
from workflows import run_dir as run_dirs
from workflows.run_dir import MARKER, RunDirLock
from workflows.tracking import Tracking, git_commit


def output_fingerprint(run_dir: Path, stage: Stage) -> str | None:
    files = [run_dir / stage.name / f for f in stage.outputs]
    if not all(f.exists() for f in files):
        return None
    return digest(b"".join(f.read_bytes() for f in files))


def stage_key(cfg: PipelineConfig, stage: Stage, state: RunState) -> tuple[str, dict[str, str]]:
    inputs = {}
    for upstream in stage.inputs:
        fp = state.fingerprints.get(upstream) or _finished_fingerprint(state.run_dir, upstream)
        if fp is None:
            raise ConfigError(f"stage {stage.name} needs {upstream}'s output in "
                              f"{state.run_dir / upstream}; run it first "
                              f"(stages=[{upstream},{stage.name}])")
        inputs[upstream] = fp
    sections = {s: _section(cfg, s) for s in stage.reads(cfg)}
    return json_digest({"stage": stage.name, "config": sections, "inputs": inputs}), inputs


# keys added after runs were finished with that section: digested only once set away from
# their default, so the stages a run finished before keep their keys (and their outputs)
ADDED_KEYS = {"extract.layout.spread": None}


def _section(cfg: PipelineConfig, name: str):
    """A config section ("extract") or one key ("serve.num_speculative_tokens"), as plain
    data, without ADDED_KEYS at their default."""
    value = cfg
    for part in name.split("."):
        value = getattr(value, part)
    if not hasattr(value, "__dataclass_fields__"):
        return value
    data = asdict(value)
    for key, default in ADDED_KEYS.items():
        head, _, rest = key.partition(".")
        if head != name:
            continue
        *path, last = rest.split(".")
        holder = data
        for part in path:
            holder = holder[part]
        if holder.get(last) == default:
            del holder[last]
    return data


def _intact_marker(run_dir: Path, stage: Stage) -> dict | None:
    """The stage's completion marker, if its outputs still have the recorded fingerprint."""
    done = run_dirs.read_json(run_dir / stage.name / MARKER)
    if done is None:
        return None
    return done if output_fingerprint(run_dir, stage) == done.get("output_fingerprint") else None


def _finished_fingerprint(run_dir: Path, name: str) -> str | None:
    """The output fingerprint of a finished stage that this invocation does not run."""
    done = _intact_marker(run_dir, STAGES[name])
    damaged = run_dirs.damage(run_dir, name) if done else {}
    if damaged:
        raise ConfigError(f"the {name} stage's output in {run_dir / name} is damaged "
                          f"({run_dirs.describe(damaged)}); add {name} to the stages to redo "
                          f"the damaged part (stages=[{name},...])")
    return done["output_fingerprint"] if done else None


def _up_to_date(run_dir: Path, stage: Stage, key: str) -> dict | None:
    done = _intact_marker(run_dir, stage)
    return done if done and done.get("key") == key else None


PROG = "python -m workflows.pipeline"  # `eyas run` names itself here


def run(cfg: PipelineConfig, plan: RunPlan | None = None, debug: bool = False) -> RunState:
    """Run the configured stages; `plan`: preflight's (made here when not given); `debug`:
    the engines' and Ray's own logs on (eyas.progress)."""
    missing = [s for s in cfg.stages if s not in STAGES]
    if missing:
        raise ConfigError(f"stages {missing} are not available in this version of eyas "
                          f"(available: {', '.join(STAGES)})")
    plan = plan or preflight(cfg)
    run_dir = Path(cfg.run_dir)
    with RunDirLock(run_dir):  # before anything is written there, MLflow's store included
        # the store is reached and written before any work, before Ray starts: an unreachable
        # or unwritable one stops the run within seconds (TrackingUnavailable, exit 2)
        tracking = Tracking(cfg.mlflow.tracking_uri, cfg.mlflow.experiment, run_dir)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        with _ray(debug):
            try:
                _check_nodes(cfg, run_dir)
                return _run(cfg, plan, run_dir, tracking)
            finally:  # calls the store did not take (it went away mid-run) wait for a replay
                note = tracking.unlogged_note()
                if note:
                    print(note, file=sys.stderr)


def _check_nodes(cfg: PipelineConfig, run_dir: Path) -> None:
    """On a cluster of several nodes, each must see the run directory and the target (or the
    cache it is built into) before any stage starts (tasks/cluster.py)."""
    from tasks.cluster import check_shared

    target = cfg.target.path or cfg.target.builtin.cache_dir
    seen = check_shared(run_dir, [target])
    if seen:
        print(f"cluster: {len(seen)} nodes, each sees {run_dir} and {target}", file=sys.stderr)


class Stopped(KeyboardInterrupt):
    """SIGTERM reached the driver (a scheduler's or a person's stop): unwinds as Ctrl-C does.
    A KeyboardInterrupt, because Ray's wait (ray.get, ray.wait) checks signals and returns
    at once only for that: any other error a handler raises there is held until the awaited
    work ends (a stage's whole length), then surfaces as a SystemError."""


_stop_requested: list[str] = []  # the signal's name once one arrived


def _stop(signum, frame):
    # raised where the driver is; code that catches every Exception (a wrapped raise inside a
    # Ray or MLflow call) may swallow it, so the stage loop also checks the request
    _stop_requested.append(signal.Signals(signum).name)
    raise Stopped(_stop_requested[-1])


@contextlib.contextmanager
def _ray(debug: bool = False):
    """Joins RAY_ADDRESS / a `ray job submit` cluster, else starts a local Ray (stopped after
    the run); a caller that started Ray keeps it. SIGTERM, whose handler Ray's own replaces at
    init with a stack dump and an abort, unwinds the run instead (Stopped): Ray is shut down,
    the run directory unlocked, and what finished stays as written. Ray's own INFO lines stay
    out of the output unless `debug`, which reaches every worker as EYAS_DEBUG."""
    started = not ray.is_initialized()
    if started:
        if debug:  # a local Ray's workers inherit the driver's environment, a cluster's do not
            os.environ[DEBUG_ENV] = "1"
            ray.init(log_to_driver=True, runtime_env={"env_vars": {DEBUG_ENV: "1"}})
        else:
            for key, value in QUIET_ENV.items():  # what a user set stays
                os.environ.setdefault(key, value)
            ray.init(log_to_driver=True, logging_level=logging.WARNING)
    main_thread = threading.current_thread() is threading.main_thread()
    _stop_requested.clear()
    previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    try:
        yield
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if started:
            ray.shutdown()


def _run(cfg: PipelineConfig, plan: RunPlan, run_dir: Path, tracking: Tracking) -> RunState:
    state = RunState(cfg, run_dir, tracking, plan)
    name = cfg.mlflow.run_name or f"{Path(cfg.target.path or cfg.target.packaged or 'builtin').name}-" \
                                  f"{time.strftime('%Y%m%d-%H%M%S')}"
    tags = {"eyas.git_commit": git_commit(), "eyas.run_dir": str(run_dir),
            "eyas.stages": ",".join(cfg.stages)}
    with tracking.parent(name, flatten(cfg), tags) as parent:
        tracking.log_file(run_dir / "config.yaml")
        for stage in (STAGES[s] for s in STAGES if s in cfg.stages):
            key, inputs = stage_key(cfg, stage, state)
            input_tags = {f"eyas.input.{k}": v for k, v in inputs.items()}
            with tracking.stage(stage.name, f"{name}/{stage.name}", {"eyas.key": key,
                                                                    **input_tags}):
                state.summary[stage.name] = _run_stage(state, stage, key, inputs)
                if _stop_requested:  # at the latest after the stage that was running
                    raise Stopped(_stop_requested[-1])
            _tag_target_and_layout(state, parent)
        summary = _summary_table(state.summary)
        tracking.log_json(state.summary, "summary.json")
        # the summary row runs are compared by: predicted, reference and served tau, speedup
        tracking.log_metrics(state.results, "summary.", run_id=parent)
    print(summary)
    print(f"\nrun directory: {run_dir}\nMLflow: mlflow ui --backend-store-uri {tracking.uri}")
    return state


def _run_stage(state: RunState, stage: Stage, key: str, inputs: dict[str, str]) -> dict:
    """Skip the stage if its output for this key is there and intact, else (re)do it."""
    run_dir, tracking = state.run_dir, state.tracking
    restored = run_dirs.restore(run_dir, stage.name, key)
    done = _up_to_date(run_dir, stage, key)
    damaged = run_dirs.damage(run_dir, stage.name) if done else {}
    if done and not damaged:
        tracking.set_tags({"eyas.skipped": "up to date",
                           "eyas.output_fingerprint": done["output_fingerprint"],
                           **({"eyas.restored": str(run_dirs.previous_dir(run_dir, stage.name))}
                              if restored else {})})
        state.fingerprints[stage.name] = done["output_fingerprint"]
        return {"skipped": f"up to date since {done['finished_at']}", **done["summary"]}
    if damaged:
        print(f"eyas: {stage.name}: redoing damaged output: {run_dirs.describe(damaged)}",
              file=sys.stderr)
        tracking.set_tags({"eyas.repaired": run_dirs.describe(damaged)})
        tracking.log_json(damaged, f"{stage.name}/repaired.json")
    run_dirs.begin(run_dir, stage.name, key)
    started = time.time()
    rows = stage.run(state)
    tracking.log_metrics({"stage_seconds": time.time() - started})
    fp = output_fingerprint(run_dir, stage)
    state.fingerprints[stage.name] = fp
    tracking.set_tags({"eyas.output_fingerprint": fp})
    (run_dir / stage.name / MARKER).write_text(json.dumps({
        "key": key, "inputs": inputs, "output_fingerprint": fp,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "summary": rows}, indent=1, default=str))
    run_dirs.finish(run_dir, stage.name)
    return {**rows, "repaired": ", ".join(sorted(damaged))} if damaged else rows


def _tag_target_and_layout(state: RunState, parent_id: str) -> None:
    """Tag the parent run with the target and the planned layout, as early as possible."""
    if resolved_target(state, required=False) is None:
        return
    tags = {"eyas.target_fingerprint": state.identity.fingerprint}
    try:
        layout = state.plan.layout_on(state.identity)
        tags.update({"eyas.layout": layout.describe(),
                     "eyas.layout_fingerprint": json_digest(layout.to_dict() | {"norms": {}})})
    except (LayoutError, ConfigError) as e:
        if any(s in state.cfg.stages for s in list(STAGES)[1:]):
            raise
        tags["eyas.layout"] = f"unresolved: {e}"
    state.tracking.set_tags(tags, parent_id)


def _summary_table(summary: dict[str, dict[str, object]]) -> str:
    lines = ["", "stage      | item     | result", "-" * 72]
    for stage, rows in summary.items():
        for item, value in rows.items():
            lines.append(f"{stage:<10} | {item:<8} | {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every stage ran (or was up to date); 2 on bad input; 1 on a failed check.
    Errors print as one `eyas:` paragraph; `--debug` adds the traceback."""
    debug, argv = debug_requested(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(argv):
        print(usage(PROG))
        return 0
    if not debug:  # "Creating initial MLflow database tables..." is not a user's business
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    try:
        cfg = load_config(argv)
        plan = preflight(cfg)  # everything that can be checked before a stage touches run_dir
    except ConfigError as e:
        return explain(e, debug)
    try:  # the run directory is locked and the MLflow store checked before Ray starts
        run(cfg, plan, debug)
    except (Exception, KeyboardInterrupt) as e:
        stop = interrupt_in(e)
        if stop is None:  # eyas's own errors are explained; anything else is a bug: re-raised
            return explain(e, debug)
        # a stop inside Ray's wait comes back as Ray's own KeyboardInterrupt: the handler's
        # record says which signal it was
        how, code = (("SIGTERM", 128 + signal.SIGTERM) if _stop_requested else
                     ("Ctrl-C", 128 + signal.SIGINT))
        print(f"eyas: stopped by {how}. Every stage, shard and training checkpoint finished "
              f"before is kept as written: run the same command to resume from them "
              f"(run_dir={cfg.run_dir})", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
