"""The evaluate stage's library: standalone accuracy and predicted τ, measured τ, the gap alarm
and the skew doctor. No serving engine, no Ray, no MLflow.

    measured.py      measure_tau(target_model, draft, layout, prompts, k, n) -> AcceptanceStats
    gap.py           accuracy_gap(...): training's figure not reproduced on its own shards
    doctor.py        diagnose(draft, layout, data_dir, target_head, ...) -> Verdict
    findings.py      Finding, and how accuracies are said in one
    candidates.py    the alternative layouts the doctor tries
    fingerprints.py  which stored slot a handed-in feature is
    load.py          diagnose_run(data_dir, draft_dir, target_dir, features_path)
    report.py        report_dict(...) for run_dir/evaluate/report.json, figures
    run.py           the stage on artifacts on disk
The per-position accuracy itself is eyas/draft/accuracy.py (training reports it too).
"""
from eyas.draft.accuracy import StepAccuracy, evaluate_draft, predicted_tau
from eyas.evaluate.doctor import Verdict, diagnose
from eyas.evaluate.findings import Finding
from eyas.evaluate.gap import SkewAlarm

__all__ = ["Finding", "SkewAlarm", "StepAccuracy", "Verdict", "diagnose", "evaluate_draft",
           "predicted_tau"]
