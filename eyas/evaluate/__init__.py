"""The evaluate stage's library: standalone accuracy and predicted τ, measured τ, the gap alarm
and the skew doctor. No serving engine, no Ray, no MLflow.

    standalone.py    evaluate_draft(draft, dataset, target_head, steps) -> StepAccuracy
    measured.py      measure_tau(target_model, draft, layout, prompts, k, n) -> AcceptanceStats
    gap.py           check_training_gap(...) raises SkewAlarm(verdict)
    doctor.py        diagnose(draft, layout, data_dir, target_head, ...) -> Verdict
    candidates.py    the alternative layouts the doctor tries
    fingerprints.py  which stored slot a handed-in feature is
    load.py          diagnose_run(data_dir, draft_dir, target_dir, features_path)
    report.py        report_dict(...) for run_dir/evaluate/report.json, figures
"""
from eyas.evaluate.doctor import Finding, Verdict, diagnose
from eyas.evaluate.gap import SkewAlarm, check_training_gap
from eyas.evaluate.standalone import StepAccuracy, evaluate_draft, predicted_tau

__all__ = ["Finding", "SkewAlarm", "StepAccuracy", "Verdict", "check_training_gap", "diagnose",
           "evaluate_draft", "predicted_tau"]
