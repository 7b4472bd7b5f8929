"""The stage runners: each runs its stage as Ray work, logs to its MLflow child run, and
returns the rows of the end-of-run summary. What a stage depends on is declared in `STAGES`:
the config sections and keys it reads and the stages whose outputs it consumes (see
workflows/pipeline.py for how that decides whether a stage is up to date).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray

from eyas.config import PipelineConfig
from eyas.layout import TargetIdentity
from eyas.run_records import TARGET_FILE, TargetRecord, read_target, target_file, write_target
from workflows.config import ConfigError, RunPlan
from workflows.tracking import Tracking


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
    record = write_target(state.run_dir, TargetRecord(result["target_path"], result["identity"],
                                                      report or None))
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
        rows["target"] = (
            f"{report['packaged']}, {report['num_parameters'] / 1e6:.1f}M params in "
            f"{report['dtype']}, converted from {Path(report['source']).name}"
            if "packaged" in report else
            f"held-out loss {report['heldout_loss']:.3f} vs unigram "
            f"{report['unigram_loss']:.3f} nats/token, {report['num_parameters'] / 1e6:.2f}M params")
    t.log_file(out / "manifest.json", "prepare")
    t.log_file(record, "prepare")
    return rows


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
    """The built-in target an earlier prepare recorded, checked before a stage reads it (its
    cache is outside the run directory, shared, and may have been damaged since): a damaged
    one is said in one line and rebuilt (the same config builds the same target), and must
    come back as the target that prepare recorded, or the run stops naming it."""
    import sys

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
    from eyas.progress import progress
    from eyas.targets import load_tokenizer
    from tasks.extract import run_extraction
    from workflows.plots import norm_fingerprints

    cfg, t = state.cfg, state.tracking
    target_path, identity = resolved_target(state)
    layout = state.plan.layout_on(identity)
    out = state.run_dir / "extract"
    online = cfg.train.source == "online"
    bar = progress(desc="extract", unit="shard")
    manifest = run_extraction(target_path, layout, cfg.extract, cfg.target.dtype,
                              state.run_dir / "prepare", out, load_tokenizer(target_path),
                              on_shard=lambda record: bar.update(1), online=online)
    bar.close()
    norms = manifest["layout"]["norms"]
    bare = manifest.get("bare_forward_tokens_per_s")
    if bare:  # the target's forward alone, same batches: the ceiling extraction is held to
        t.log_metrics({"bare_forward_tokens_per_s": bare,
                       "of_bare_forward": manifest["tokens_per_s"] / bare})
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
    t.set_tags({"eyas.source": cfg.train.source})
    if online:
        return {"data": f"online: the probe set only ({manifest['totals']['train']['samples']} "
                        "train samples are streamed from the target while training)",
                "norms": "probe " + ", ".join(f"{k} {v[0]:.3g}" for k, v in norms.items())}
    return {
        "data": f"{len(manifest['shards'])} shards, {manifest['totals']['train']['tokens']} "
                f"train tokens, {manifest['tokens_per_s']:.0f} tokens/s"
                + (f" ({manifest['tokens_per_s'] / bare:.2f} of a bare forward's {bare:.0f})"
                   if bare else ""),
        "norms": ", ".join(f"{k} {v[0]:.3g}" for k, v in norms.items())}


def run_train(state: RunState) -> dict:
    from eyas.train.report import FEEDER_REPORT_FILE, TRAIN_REPORT_FILE, TrainReport
    from tasks.train import run_training

    cfg, t = state.cfg, state.tracking
    target_path, _ = resolved_target(state)
    out = state.run_dir / "train"
    # the cluster's GPUs, not the driver's: under `ray job submit` it runs on the head
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    online = cfg.train.source == "online"
    if online:
        feeder = _train_online(state, target_path, out, use_gpu)
    else:
        run_training(state.run_dir / "extract", target_path, out, cfg.train, cfg.draft,
                     t.worker_log(), use_gpu=use_gpu)
    report = TrainReport.read(out)
    t.log_metrics({"tokens_per_s": report.tokens_per_s, "steps": report.steps,
                   **{f"train.acc_step{k}": a for k, a in enumerate(report.train_accuracy)},
                   **{f"heldout.acc_step{k}": a for k, a in enumerate(report.heldout_accuracy)},
                   **{f"heldout.full_acc_step{k}": a
                      for k, a in enumerate(report.heldout_full_accuracy)}})
    t.log_file(out / "draft" / "config.json", "draft")
    t.log_file(out / TRAIN_REPORT_FILE, "train")
    rows = {}
    if online:
        from dataclasses import asdict

        from workflows.plots import norm_fingerprints

        norms = report.stream.norms
        if feeder is not None:
            t.log_metrics({f"stream.{k}": v for k, v in asdict(feeder).items()
                           if not isinstance(v, bool)})
        t.log_metrics({f"stream.norm.{slot}.{stat}": value for slot, (mean, std) in norms.items()
                       for stat, value in (("mean", mean), ("std", std))})
        t.log_figure(norm_fingerprints(norms, "streamed (first epoch)"),
                     "train/stream_norm_fingerprints.png")
        rows["stream"] = (f"online: {feeder.computed_steps} steps computed by "
                          f"{feeder.replicas} target replica(s), {feeder.reused_steps} "
                          f"reused, at most {feeder.most_queued} queued "
                          f"(train.online.queue_steps={feeder.queue_steps})"
                          + (f", rewound {feeder.rewinds}x for a restarted trainer"
                             if feeder.rewinds else "")
                          if feeder is not None else
                          f"online: the stream's report could not be read ({FEEDER_REPORT_FILE})")
    return {**rows, "draft": report.draft_dir,
            "accuracy": f"per TTT step, held-out {two_places(report.heldout_accuracy)}; "
                        f"train (while training, last epoch) {two_places(report.train_accuracy)}",
            "speed": f"{report.steps} steps, {report.tokens_per_s:.0f} tokens/s"}


def _train_online(state: RunState, target_path: str, out: Path, use_gpu: bool):
    """Train with the target streaming its states (tasks/online.py); how the stream was fed
    (eyas.train.report.FeederReport, None when the Feeder's report could not be read)."""
    from eyas.layout import HiddenStateLayout
    from eyas.targets import load_tokenizer
    from eyas.train.report import FEEDER_REPORT_FILE
    from eyas.train.stream import OnlineStream
    from tasks.online import start_stream, stop_stream
    from tasks.train import run_training

    cfg = state.cfg
    extract = state.run_dir / "extract"
    manifest = json.loads((extract / "manifest.json").read_text())
    if "online" not in manifest:
        raise ConfigError(f"train.source=online but {extract} is an offline extraction; run the "
                          "extract stage with train.source=online (stages=[extract,train,...])")
    prepare = manifest["online"]["prepare_dir"]
    layout = HiddenStateLayout.from_dict(manifest["layout"])
    feeder, replicas = start_stream(target_path, layout, cfg.extract, cfg.target.dtype,
                                    Path(prepare), cfg.train, manifest["totals"],
                                    load_tokenizer(target_path).pad_token_id or 0)
    try:
        run_training(extract, target_path, out, cfg.train, cfg.draft,
                     state.tracking.worker_log(), use_gpu=use_gpu,
                     online=OnlineStream(feeder, layout, prepare,
                                         manifest["totals"]["train"]["samples"]))
    finally:
        report = stop_stream(feeder, replicas)
    if report is None:
        (out / FEEDER_REPORT_FILE).write_text("{}")  # what it always wrote then
    else:
        report.write(out)
    return report


class StageFailed(RuntimeError):
    """A stage that ran and found a fault it must not log and forget (skew, failed parity)."""


def _draft_dir(state: RunState) -> str:
    return state.cfg.serve.draft or str(state.run_dir / "train" / "draft")


def run_evaluate(state: RunState) -> dict:
    from eyas.evaluate.report import REPORT_FILE, EvaluateReport
    from tasks import run_in_actor
    from tasks.evaluate import EvaluateActor

    cfg, t = state.cfg, state.tracking
    target_path, _ = resolved_target(state)
    out = state.run_dir / "evaluate"
    result = run_in_actor(EvaluateActor, str(state.run_dir / "extract"), _draft_dir(state),
                          target_path, cfg.eval, str(out), cfg.serve.num_speculative_tokens,
                          dict(cfg.serve.prompt_sets), num_cpus=1)
    report = EvaluateReport.read(out)
    doctor = report.verdict
    t.log_file(out / REPORT_FILE, "evaluate")
    t.log_text(report.explain, "evaluate/doctor.txt")
    splits = {"train": report.train, "heldout": report.heldout}
    t.log_metrics({f"{split}.{kind}_pos{i}": v for split, acc in splits.items()
                   for kind in ("full", "conditional")
                   for i, v in enumerate(getattr(acc, kind))})
    t.log_metrics({"predicted_tau": report.heldout.predicted_tau,
                   "predicted_tau_train": report.train.predicted_tau,
                   "measured_tau": report.measured_tau or 0.0,
                   "doctor_ok": float(doctor.ok)})
    t.set_tags({"eyas.doctor": ",".join(doctor.findings) or
                ("inconclusive" if doctor.inconclusive else "ok")})
    t.log_figure(_accuracy_plot(report), "evaluate/per_position_accuracy.png")
    if doctor.probe_norms:
        from workflows.plots import norm_fingerprints
        t.log_figure(norm_fingerprints(doctor.probe_norms, "probe set: every layer"),
                     "evaluate/norm_fingerprints.png")
    if "alarm" in result:
        raise StageFailed(f"evaluate: the skew doctor found a fault\n{result['alarm']}")
    state.results["predicted_tau"] = report.heldout.predicted_tau
    state.results["reference_tau"] = report.measured_tau
    return {"accuracy": f"held-out per position {two_places(report.heldout.full)} (train "
                        f"{two_places(report.train.full)})",
            "tau": f"predicted {report.heldout.predicted_tau:.2f}, measured "
                   f"{report.measured_tau:.2f} (reference engine, {report.prompts} prompts)",
            "doctor": doctor.status + (f": {doctor.inconclusive}" if doctor.inconclusive
                                       else "")}


def _accuracy_plot(report):
    from workflows.plots import per_position_bars
    return per_position_bars({"train": report.train.full, "held-out": report.heldout.full},
                             "draft accuracy per position (standalone)")


def run_serve(state: RunState) -> dict:
    from eyas.serve.export import launch_command
    from eyas.serve.report import REPORT_FILE, ServeReport
    from tasks import run_in_actor
    from tasks.serve import ServeActor
    from workflows.plots import per_position_bars

    cfg, t = state.cfg, state.tracking
    target_path, _ = resolved_target(state)
    out = state.run_dir / "serve"
    draft = _draft_dir(state)
    # the evaluate stage measured this draft (serve.draft too) offline in this run: the gap
    # alarm compares its profiles with the served ones
    offline = str(state.run_dir / "evaluate") if state.fingerprints.get("evaluate") else None
    result = run_in_actor(ServeActor, target_path, draft, str(state.run_dir / "extract"),
                          cfg.serve, str(out), offline, num_cpus=1)
    report = ServeReport.read(out)
    t.log_file(out / REPORT_FILE, "serve")
    bench = report.benchmark
    parity = "refused by the doctor" if report.refused else PARITY_WORDS[report.parity]
    t.set_tags({"eyas.parity": parity,
                "eyas.engine": bench.engine_version if bench else cfg.serve.engine,
                "eyas.draft": draft})
    t.log_text(launch_command("vllm", target_path, report.served or draft,
                              cfg.serve.num_speculative_tokens),
               "serve/launch_vllm.txt")
    if report.parity is not None:
        t.log_metrics({"parity": float(report.parity)})
    weights = (report.parity_detail or {}).get("weights")
    if weights is not None:  # eyas.serve.loaded: the drafter holds the draft's tensors
        t.log_metrics({"loaded_weights": float(weights["ok"]),
                       "loaded_logits_error": weights["logits"]["error"]})
    if "parity_error" in result and bench is None:
        raise StageFailed(f"serve: {result['parity_error']}")
    t.log_metrics({"tau": bench.tau, "tokens_per_s_spec": bench.tokens_per_s_spec,
                   "tokens_per_s_plain": bench.tokens_per_s_plain, "speedup": bench.speedup,
                   "latency_ratio": bench.latency_ratio,
                   "time_per_token_ms_spec": bench.time_per_token_ms_spec,
                   "time_per_token_ms_plain": bench.time_per_token_ms_plain,
                   "lossless": float(bench.lossless)})
    for point in bench.sweep:
        t.log_metrics({"tau": point.tau, "ratio": point.ratio,
                       "tokens_per_s_spec": point.tokens_per_s_spec,
                       "tokens_per_s_plain": point.tokens_per_s_plain,
                       "time_per_token_ms_spec": point.time_per_token_ms_spec,
                       "time_per_token_ms_plain": point.time_per_token_ms_plain,
                       "lossless": float(point.lossless)},
                      prefix=f"concurrency{point.concurrency}.")
    if len(bench.sweep) > 1:
        from dataclasses import asdict

        from workflows.plots import concurrency_sweep
        t.log_figure(concurrency_sweep([asdict(p) for p in bench.sweep]),
                     "serve/concurrency_sweep.png")
    t.log_metrics({f"acceptance_pos{i}": a
                   for i, a in enumerate(bench.per_position_acceptance)})
    if bench.acceptance.get("tau_interval"):  # 95 %, from the accepted lengths' spread
        t.log_metrics(dict(zip(("tau_low", "tau_high"), bench.acceptance["tau_interval"])))
    t.log_figure(per_position_bars({cfg.serve.engine: bench.per_position_acceptance},
                                   "served per-position acceptance"),
                 "serve/per_position_acceptance.png")
    log_prompt_sets(t, bench, report.gap)
    if "parity_error" in result:  # the gap alarm: raised after the benchmark was logged
        raise StageFailed(f"serve: {result['parity_error']}")
    state.results[f"{cfg.serve.engine}_tau"] = bench.tau
    state.results["speedup"] = bench.speedup
    state.results["latency_ratio"] = bench.latency_ratio  # concurrency 1: the headline
    if not bench.lossless:
        raise StageFailed("serve: greedy output with the draft differs from the target's alone "
                          "beyond near-ties of the target's own (serve/report.json: partings): "
                          "speculation must be lossless")
    parted = sum(len(p.partings or []) for r in bench.prompt_sets for p in r.sweep)
    sweep = ", ".join(f"c={p.concurrency} {p.ratio:.2f}" for p in bench.sweep[1:])
    low, high = bench.acceptance.get("tau_interval") or (bench.tau, bench.tau)
    return {"tau": f"{bench.tau:.2f} ± {(high - low) / 2:.2f} (95 %, "
                   f"{bench.acceptance.get('drafts', 0)} drafts; {bench.engine_version}, k="
                   f"{bench.num_speculative_tokens}, {bench.prompts} prompts)",
            "latency": f"concurrency 1: {bench.time_per_token_ms_spec:.1f} ms/token with "
                       f"the draft vs {bench.time_per_token_ms_plain:.1f} without, ratio "
                       f"{bench.latency_ratio:.2f}; lossless"
                       + (f" ({parted} outputs parted, each at a near-tie of the target's, "
                          f"{cfg.serve.dtype} numerics)" if parted else ""),
            **({"sweep": f"speculative / plain time per token: {sweep}"} if sweep else {}),
            **({"prompt sets": _sets_line(bench)} if len(bench.prompt_sets) > 1 else {}),
            **({"gap alarm": _gap_line(report.gap)} if report.gap else {}),
            "parity": {True: "engine feeds the trained slots", False: "FAILED (forced)",
                       None: report.parity_detail["message"]}[report.parity]}


def log_prompt_sets(t, bench, gap) -> None:
    """Per prompt set: tau with its interval, per-position acceptance, and at every
    concurrency vLLM bench serve's metrics with and without the draft (sets.NAME.c4.
    spec.p99_tpot_ms ...); a plot of tau per set; the gap alarm's findings."""
    from workflows.plots import tau_per_set

    for r in bench.prompt_sets:
        low, high = r.acceptance["tau_interval"]
        t.log_metrics({"tau": r.sweep[0].tau, "tau_low": low, "tau_high": high,
                       **{f"acceptance_pos{i}": a
                          for i, a in enumerate(r.sweep[0].per_position_acceptance)}},
                      prefix=f"sets.{r.name}.")
        for p in r.sweep:
            at = f"sets.{r.name}.c{p.concurrency}."
            t.log_metrics({"ratio": p.ratio, "tau": p.tau}, prefix=at)
            for side, metrics in (("spec.", p.with_draft), ("plain.", p.without_draft)):
                t.log_metrics(metrics or {}, prefix=at + side)
    if bench.prompt_sets:
        t.log_figure(tau_per_set(bench.prompt_sets), "serve/tau_per_set.png")
    if gap:
        t.log_metrics({"gap_findings": len(gap["findings"])})
        t.set_tags({"eyas.gap": ",".join(f["name"] for f in gap["findings"]) or "ok"})


def _sets_line(bench) -> str:
    def one(r):
        low, high = r.acceptance["tau_interval"]
        return (f"{r.name} τ {r.sweep[0].tau:.2f} ± {(high - low) / 2:.2f}, ratio "
                f"{r.sweep[0].ratio:.2f}")
    return "; ".join(one(r) for r in bench.prompt_sets)


def _gap_line(gap: dict) -> str:
    if not gap["findings"]:
        return (f"quiet: served acceptance per position within {gap['z']} standard errors of "
                f"the evaluate stage's on {', '.join(gap['compared'])}")
    return "FIRED: " + "; ".join(f["message"] for f in gap["findings"])


PARITY_WORDS = {True: "ok", False: "FAILED", None: "not applicable"}


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
    "prepare": Stage("prepare", run_prepare, ("target", "data"), (), ("manifest.json", TARGET_FILE)),
    # the target is loaded in target.dtype; online, the probe set alone is stored
    "extract": Stage("extract", run_extract, ("extract", "target.dtype", "train.source"),
                     ("prepare",), ("manifest.json",)),
    # online, the target replicas streaming to the trainer are extract's
    "train": Stage("train", run_train, ("draft", "train"), ("extract",),
                   ("draft/config.json", "draft/model.safetensors"),
                   online_config=("extract", "target.dtype")),
    # the draft is scored at the k it is served with, the foreign one where serve.draft names it
    "evaluate": Stage("evaluate", run_evaluate,
                      ("eval", "serve.draft", "serve.num_speculative_tokens",
                       "serve.prompt_sets"), ("train",),
                      ("report.json",)),
    "serve": Stage("serve", run_serve, ("serve",), ("train",), ("report.json",)),
}


def two_places(values) -> str:
    """Per-position accuracies as the summary table shows them: "0.46 0.44 0.41"."""
    return " ".join(f"{v:.2f}" for v in values)
