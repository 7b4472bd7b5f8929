"""The evaluate stage on artifacts on disk: standalone accuracy, predicted and measured tau,
the doctor's verdict, and the gap alarm that fails the stage instead of logging a number."""
from __future__ import annotations

import json
from pathlib import Path

from eyas.config import EvalConfig
from eyas.evaluate.doctor import diagnose
from eyas.evaluate.gap import SkewAlarm
from eyas.evaluate.load import (load_draft_as_served, prepared_chat_template, reported_accuracy,
                               why_not_reported)
from eyas.evaluate.measured import heldout_prompts, measure_tau
from eyas.evaluate.report import report_dict
from eyas.draft.accuracy import evaluate_draft
from eyas.extract.on_demand import open_split
from eyas.target import identify
from eyas.target.parts import target_parts


def evaluate_run(data_dir: str | Path, draft_dir: str | Path, target_dir: str | Path,
                 cfg: EvalConfig, out_dir: str | Path) -> dict:
    """Write out_dir/report.json; raise SkewAlarm (after writing it) when the doctor finds a
    fault, e.g. what training measured while it trained not reproduced on its own shards."""
    from transformers import AutoModelForCausalLM

    if cfg.steps is None:  # workflows.config sets it to serve.num_speculative_tokens
        raise ValueError("EvalConfig.steps is unset: give the k the draft will be served at")
    embedding, head = target_parts(target_dir)
    target_identity = identify(target_dir)  # a draft of another format is read against it
    draft, layout, d2t_missing = load_draft_as_served(draft_dir, embedding, target_identity)
    # online runs (train.source=online) stored no shards: the target recomputes these
    train = open_split(data_dir, "train", max_samples=cfg.max_train_samples)
    heldout = open_split(data_dir, "heldout")
    train_acc = evaluate_draft(draft, train, head, cfg.steps, max_samples=cfg.max_train_samples)
    heldout_acc = evaluate_draft(draft, heldout, head, cfg.steps)
    reported = reported_accuracy(draft_dir)
    verdict = diagnose(draft, layout, data_dir, head, steps=cfg.steps, reported=reported,
                       reported_missing=why_not_reported(draft_dir),
                       tolerance=cfg.gap_tolerance, target=target_identity,
                       prepared_chat_template=prepared_chat_template(data_dir),
                       d2t_missing=d2t_missing, train_accuracy=train_acc)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    prompts = heldout_prompts(heldout, cfg.num_prompts)
    measured = measure_tau(target, draft, layout, prompts, cfg.steps, cfg.max_new_tokens)
    report = report_dict(train_acc, heldout_acc, verdict, measured, reported)
    report["prompts"] = len(prompts)
    report["explain"] = verdict.explain()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    if verdict.findings:  # INCONCLUSIVE is reported (and tagged), not a failed stage
        raise SkewAlarm(verdict)
    return report
