"""The evaluate stage's library: standalone accuracy and predicted τ on the train and held-out
shards, measured τ, the report, and the skew doctor's verdict (eyas/doctor) as the stage's
alarm. No serving engine, no Ray, no MLflow.

    measured.py      measure_tau(target_model, draft, layout, prompts, k, n) -> AcceptanceStats;
                     measure_requests / measure_set: each request's counters
    profiles.py      write_profiles: speculation_profile.json (modelopt's format) per prompt set
    report.py        EvaluateReport: run_dir/evaluate/report.json
    run.py           evaluate_run(...): the stage on artifacts on disk; raises SkewAlarm
The per-position accuracy itself is eyas/draft/accuracy.py (training reports it too); the
figures are drawn by workflows/plots.py.
"""
from eyas.draft.accuracy import StepAccuracy, evaluate_draft, predicted_tau

__all__ = ["StepAccuracy", "evaluate_draft", "predicted_tau"]
