"""The skew doctor: which target tensors was a draft trained on, and which is it (to be) fed?
No serving engine, no Ray, no MLflow. The evaluate stage, the serve stage and
`python -m workflows.doctor` all ask it.

    diagnose.py      diagnose(Diagnosis(draft, layout, data_dir, ...)) -> Verdict: the evidence
    verdict.py       Verdict (findings, evidence table, explain, to_dict), LayoutRow, SkewAlarm
    findings.py      Finding, and how accuracies are said in one
    checks.py        checks with no model run: static_findings, fed_slots_finding
    candidates.py    the alternative layouts the doctor tries, and how two layouts relate
    evidence.py      the paired evidence that decides between them (or says it cannot)
    fingerprints.py  which stored slot a handed-in feature is
    gap.py           the training gap: training's reported accuracy not reproduced standalone
    profile.py       speculation profiles (modelopt's speculation_profile.json): build,
                     validate, read, write; profile_gap: served acceptance short of offline
    engine.py        engine_check -> EngineCheck: what an engine feeds from the draft's config
    load.py          from disk: features, reported accuracy, the run's records (drafts:
                     eyas.draft.load)
    run.py           diagnose_run(data_dir, draft_dir, target_dir, ...): the doctor on a run
"""
from eyas.doctor.diagnose import Diagnosis, diagnose
from eyas.doctor.engine import EngineCheck, engine_check
from eyas.doctor.findings import Finding
from eyas.doctor.gap import ReportedAccuracy
from eyas.doctor.run import diagnose_run
from eyas.doctor.verdict import LayoutRow, SkewAlarm, Verdict

__all__ = ["Diagnosis", "EngineCheck", "Finding", "LayoutRow", "ReportedAccuracy", "SkewAlarm",
           "Verdict", "diagnose", "diagnose_run", "engine_check"]
