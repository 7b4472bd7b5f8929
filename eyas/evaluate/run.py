"""The evaluate stage on artifacts on disk: standalone accuracy, predicted and measured tau,
the doctor's verdict, and the gap alarm that fails the stage instead of logging a number."""
from __future__ import annotations

from pathlib import Path

from eyas.config import EvalConfig
from eyas.doctor.diagnose import Diagnosis, diagnose
from eyas.doctor.load import prepared_chat_template, reported_accuracy, why_not_reported
from eyas.doctor.verdict import SkewAlarm
from eyas.evaluate.measured import heldout_prompts, measure_tau
from eyas.evaluate.report import EvaluateReport
from eyas.draft.eagle3.accuracy import evaluate_draft
from eyas.draft.load import load
from eyas.extract.on_demand import open_split
from eyas.targets import identify
from eyas.targets.parts import target_parts


def evaluate_run(data_dir: str | Path, draft_dir: str | Path, target_dir: str | Path,
                 cfg: EvalConfig, out_dir: str | Path, steps: int) -> dict:
    """Write out_dir/report.json (eyas.evaluate.report.EvaluateReport) and return it as written;
    raise SkewAlarm (after writing it) when the doctor finds a fault, e.g. what training
    measured while it trained not reproduced on its own shards."""
    from transformers import AutoModelForCausalLM

    embedding, head = target_parts(target_dir)
    target_identity = identify(target_dir)  # a draft of another format is read against it
    loaded = load(draft_dir, embedding, target_identity)
    draft, layout, d2t_missing = loaded.draft, loaded.layout, loaded.d2t_missing
    # online runs (train.source=online) stored no shards: the target recomputes these
    train = open_split(data_dir, "train", max_samples=cfg.max_train_samples)
    heldout = open_split(data_dir, "heldout")
    train_acc = evaluate_draft(draft, train, head, steps, max_samples=cfg.max_train_samples)
    heldout_acc = evaluate_draft(draft, heldout, head, steps)
    reported = reported_accuracy(draft_dir)
    verdict = diagnose(Diagnosis(
        draft, layout, data_dir, target_head=head, target=target_identity, reported=reported,
        reported_missing=why_not_reported(draft_dir), train_accuracy=train_acc,
        prepared_chat_template=prepared_chat_template(data_dir), d2t_missing=d2t_missing,
        steps=steps, tolerance=cfg.gap_tolerance))
    target = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    prompts = heldout_prompts(heldout, cfg.num_prompts)
    measured = measure_tau(target, draft, layout, prompts, steps, cfg.max_new_tokens)
    report = EvaluateReport.build(train_acc, heldout_acc, verdict, measured, reported,
                                  prompts=len(prompts))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report.write(out)
    if verdict.findings:  # INCONCLUSIVE is reported (and tagged), not a failed stage
        raise SkewAlarm(verdict)
    return report.to_dict()
