"""Several drafts and the target alone, served on the same prompt sets, side by side.

    eyas compare run_dir=RUN [draft.NAME=DIR ...] [serve.prompt_sets.NAME=FILE ...]
                 [serve.KEY=VALUE ...] [out=DIR]

The run's own draft (RUN/train/draft, named `run`) and each draft.NAME (eyas's, or another
trainer's that the doctor's readers read) pass the doctor's checks and parity first, each as the
serve stage does it (a refused one is reported and left out); then one engine serves the target
alone and one each draft, on the run's held-out split and each prompt set, at every
serve.concurrency level (eyas/serve/bench.py: the serve stage is this with one draft). The
run's config gives the target, k and the rest of `serve`; keys given here override it.

Writes OUT (default RUN/compare): NAME/report.json and NAME/speculation_profile*.json per
draft (the serve stage's files), compare.json and compare.md (the side-by-side table, also
printed), and logs one MLflow parent run with a child per draft to the run's store. The gap
alarm compares the run's own draft with the evaluate stage's offline profiles when they exist.
Exit 0: done; 2: bad input; 1: no draft could be benchmarked.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from eyas.config import PipelineConfig
from eyas.run_records import RunDir, read_target, target_file
from workflows.config import ConfigError, _validate
from workflows.run_dir import RunDirLock

PROG = "python -m workflows.compare"
SETS = "serve.prompt_sets."  # the pipeline's key: one spelling for a prompt set


def _parse(argv: list[str]):
    run_dir, out, drafts, sets, overrides = None, None, {}, {}, []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq:
            raise ConfigError(f"{arg!r}: every argument is key=value (see --help)")
        if key == "run_dir":
            run_dir = Path(value).expanduser().resolve()
        elif key == "out":
            out = Path(value).expanduser().resolve()
        elif key.startswith("draft."):
            drafts[key[len("draft."):]] = str(Path(value).expanduser().resolve())
        elif key.startswith(SETS):
            sets[key[len(SETS):]] = str(Path(value).expanduser().resolve())
        elif key.startswith("prompt_set."):
            raise ConfigError(f"{key}: a prompt set is {SETS}{key[len('prompt_set.'):]}=FILE, "
                              "the pipeline's key")
        elif key.startswith("serve."):
            overrides.append(arg)
        else:
            raise ConfigError(f"{key}: not a key of {PROG} (run_dir, out, draft.NAME, "
                              f"{SETS}NAME, serve.KEY)")
    if run_dir is None:
        raise ConfigError("run_dir=RUN is required: the run whose target and data to serve")
    return run_dir, out, drafts, sets, overrides


def load(run_dir: Path, sets: dict, overrides: list[str]) -> tuple[PipelineConfig, str]:
    """The run's config with the overrides, validated, and its target's path."""
    from eyas.conversations.prompt_sets import PromptSetError, read_prompt_sets

    config, target = run_dir / "config.yaml", target_file(run_dir)
    for path in (config, target):
        if not path.exists():
            raise ConfigError(f"run_dir={run_dir}: {path.name} is missing; compare serves a "
                              "run's target and data: run its prepare and extract stages first")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(PipelineConfig), OmegaConf.load(config),
                                 OmegaConf.from_dotlist(overrides))
        cfg: PipelineConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{config} with {' '.join(overrides)}: {e}") from None
    cfg.serve.prompt_sets = {**cfg.serve.prompt_sets, **sets}
    _validate(cfg)
    try:
        read_prompt_sets(cfg.serve.prompt_sets)
    except PromptSetError as e:
        raise ConfigError(str(e)) from None
    return cfg, read_target(run_dir).target_path


def table(reports: dict, refused: dict) -> str:
    """Markdown: per prompt set, the baseline and each draft at every concurrency level."""
    lines = []
    first = next(iter(reports.values())).benchmark
    for i, s in enumerate(first.prompt_sets):
        lines += [f"### {s.name} ({s.source}, {s.conversations} conversations)", "",
                  "| draft | τ (95 %) | accepted per position | "
                  + " | ".join(f"TPOT ms c={p.concurrency} | ratio" for p in s.sweep) + " |",
                  "|---|---|---|" + "---|---|" * len(s.sweep)]
        base = [p.without_draft or {} for p in s.sweep]
        lines.append("| target alone | | | " + " | ".join(
            f"{b.get('mean_tpot_ms', 0):.2f} | 1.00" for b in base) + " |")
        for name, report in reports.items():
            r = report.benchmark.prompt_sets[i]
            low, high = r.acceptance["tau_interval"]
            cells = []
            for p, b in zip(r.sweep, base):
                spec = (p.with_draft or {}).get("mean_tpot_ms")
                plain = b.get("mean_tpot_ms")
                cells.append(f"{spec:.2f} | {spec / plain:.2f}" if spec and plain else "- | -")
            lines.append(f"| {name} | {r.sweep[0].tau:.2f} ± {(high - low) / 2:.2f} | "
                         + "/".join(f"{a:.2f}" for a in r.sweep[0].per_position_acceptance)
                         + " | " + " | ".join(cells) + " |")
        lines.append("")
    for name, why in refused.items():
        lines.append(f"- {name}: not benchmarked: {why}")
    lines.append("TPOT: mean time per output token after the first (vLLM bench serve's); ratio: "
                 "with the draft / the target alone. τ: tokens per verify step, the target's "
                 "own token included; accepted per position: the share of verify steps that "
                 "accepted draft position i (vLLM's per-position rate).")
    return "\n".join(lines)


def _log(cfg, run_dir: Path, reports: dict, refused: dict, text: str, drafts: dict) -> None:
    from workflows.reports import log_report
    from workflows.serve_reports import ComparedDraftReport
    from workflows.tracking import Tracking

    t = Tracking(cfg.mlflow.tracking_uri, cfg.mlflow.experiment, run_dir)
    params = {"drafts": ",".join(drafts), "prompt_sets": ",".join(cfg.serve.prompt_sets),
              "serve.num_speculative_tokens": str(cfg.serve.num_speculative_tokens),
              "serve.num_prompts": str(cfg.serve.num_prompts),
              "serve.concurrency": str(cfg.serve.concurrency)}
    name = f"compare {time.strftime('%Y-%m-%d %H:%M:%S')}"
    with t.parent(name, params, {"eyas.command": "compare"}):
        t.log_text(text, "compare/compare.md")
        for draft, report in reports.items():
            with t.stage("compare", draft, {"eyas.draft": drafts[draft]}):
                log_report(t, ComparedDraftReport(report))
        for draft, why in refused.items():
            with t.stage("compare", draft, {"eyas.draft": drafts[draft], "eyas.refused": why}):
                pass
    note = t.unlogged_note()
    if note:
        print(note, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    from eyas.serve.bench import benchmark
    from eyas.serve.parity import ParityError
    from eyas.serve.run import admit, attach, gap_alarm

    try:
        run_dir, out, named, sets, overrides = _parse(argv)
        cfg, target = load(run_dir, sets, overrides)
    except ConfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    run = RunDir.of(run_dir)
    own = run.draft
    drafts = {**({"run": str(own)} if own.exists() else {}), **named}
    if not drafts:
        print(f"{PROG}: no draft to compare: {own} is missing and no draft.NAME=DIR given",
              file=sys.stderr)
        return 2
    out = out or run.compare
    data = run.extract
    with RunDirLock(run_dir):
        reports, refused = {}, {}
        for name, draft in drafts.items():
            try:
                reports[name] = admit(target, draft, data, cfg.serve, out / name)
            except ParityError as e:  # DraftRefused too: the report says why, the rest go on
                refused[name] = str(e)
                print(f"{PROG}: {name} ({draft}) is not benchmarked: {e}", file=sys.stderr)
        if not reports:
            return 1
        bench = benchmark(target, {n: r.served for n, r in reports.items()}, data, cfg.serve,
                          {n: out / n for n in reports})
        for name, report in reports.items():
            attach(report, bench, bench.results[name], cfg.serve)
            if name == "run":  # the draft the evaluate stage measured offline
                report.gap = gap_alarm(run.evaluate if run.evaluate.exists() else None,
                                       out / name, [r.name for r in bench.results[name]],
                                       cfg.serve.gap_z)
            report.write(out / name)
        text = table(reports, refused)
        (out / "compare.md").write_text(text + "\n")
        (out / "compare.json").write_text(json.dumps(
            {"drafts": drafts, "refused": refused, "engine_version": bench.engine_version,
             "reports": {n: r.to_dict() for n, r in reports.items()}}, indent=2, default=str))
        print(text)
        _log(cfg, run_dir, reports, refused, text, drafts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
