"""The evaluate stage on artifacts on disk: standalone accuracy, predicted and measured tau,
the doctor's verdict, and the gap alarm that fails the stage instead of logging a number."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from eyas.config import EvalConfig
from eyas.conversations.prompt_sets import HELDOUT, PromptSet, check_names, target_chat_renderer
from eyas.doctor.diagnose import Diagnosis, diagnose
from eyas.doctor.load import prepared_chat_template, reported_accuracy, why_not_reported
from eyas.doctor.verdict import SkewAlarm
from eyas.evaluate.measured import heldout_prompts, measure_requests, measure_set, total
from eyas.evaluate.profiles import write_profiles
from eyas.evaluate.report import EvaluateReport
from eyas.draft.accuracy import evaluate_draft
from eyas.draft.load import load
from eyas.extract.on_demand import open_split
from eyas.targets import identify
from eyas.targets.parts import target_parts


def evaluate_run(data_dir: str | Path, draft_dir: str | Path, target_dir: str | Path,
                 cfg: EvalConfig, out_dir: str | Path, steps: int,
                 prompt_sets: Sequence[PromptSet] = ()) -> dict:
    """Write out_dir/report.json (eyas.evaluate.report.EvaluateReport) and return it as written;
    raise SkewAlarm (after writing it) when the doctor finds a fault, e.g. what training
    measured while it trained not reproduced on its own shards. Also writes the speculation
    profiles (eyas.evaluate.profiles) of the held-out prompts and of each of `prompt_sets`
    (sets other than the held-out split; the first cfg.num_prompts conversations of each)."""
    from transformers import AutoModelForCausalLM

    check_names({s.name: s.source for s in prompt_sets})  # none may be called heldout
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
    requests = measure_requests(target, draft, layout, prompts, steps, cfg.max_new_tokens)
    measured = {HELDOUT: ("the run's held-out split", requests)}
    if prompt_sets:  # chats replayed through the target's chat template
        chat = target_chat_renderer(target_dir)
        for prompt_set in prompt_sets:
            measured[prompt_set.name] = (prompt_set.source, measure_set(
                target, draft, layout, prompt_set.first(cfg.num_prompts), steps,
                cfg.max_new_tokens, chat))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    profiles = write_profiles(out, measured, draft_dir, target_dir, steps, cfg.max_new_tokens)
    report = EvaluateReport.build(train_acc, heldout_acc, verdict, total(requests, steps),
                                  reported, prompts=len(prompts), profiles=profiles)
    report.write(out)
    if verdict.findings:  # INCONCLUSIVE is reported (and tagged), not a failed stage
        raise SkewAlarm(verdict)
    return report.to_dict()
