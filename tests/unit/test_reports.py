"""The stage reports' types: what a run directory of an earlier version holds reads back, and
writes out byte for byte as it was (same keys, same order), whichever branch wrote it."""
import json

import pytest

from eyas.evaluate.report import EvaluateReport
from eyas.serve.report import ServeReport
from eyas.train.report import FeederReport, StreamNorms, TrainReport

# as the writers before the types wrote them (eyas/train/loop.py: asdict of its outcome;
# tasks/online.py: the Feeder's stats; eyas/evaluate/run.py and eyas/serve/run.py: dicts)
OFFLINE_TRAIN = {"draft_dir": "/r/train/draft", "steps": 12, "resumed_from": None,
                 "losses": [2.5, 2.25], "train_accuracy": [0.5, 0.25],
                 "train_accuracy_steps": 6, "train_accuracy_tokens": [40, 38],
                 "heldout_accuracy": [0.5, 0.125], "heldout_full_accuracy": [0.375, 0.125],
                 "tokens_per_s": 1234.5, "stream": {}}
ONLINE_TRAIN = {**OFFLINE_TRAIN, "resumed_from": 6, "stream": {
    "online": True, "norms": {"embed": [0.5, 0.25], "block_out:1": [3.5, 1.0]},
    "norm_tokens": 321, "received_steps": 6}}
FEEDER = {"computed_steps": 12, "reused_steps": 0, "most_queued": 4, "queue_steps": 4,
          "keep_epoch": False, "replicas": 2, "rewinds": 1}
ACCURACY = {"full": [0.5, 0.25], "in_vocab": [0.5, 0.5], "conditional": [0.5, 0.5],
            "predicted_tau": 1.75, "samples": 6, "counted": [40, 38]}
EVALUATE = {"per_position_accuracy": {"train": ACCURACY, "heldout": {**ACCURACY, "samples": 2}},
            "predicted_tau": {"train": 1.75, "heldout": 1.75}, "measured_tau": 1.5,
            "measured": {"drafts": 4, "accepted": 2},
            "reported_train_accuracy": [0.5, 0.5],
            "reported_train_accuracy_source": "measured during training",
            "doctor": {"ok": False, "status": "FAULT (shifted)", "inconclusive": "",
                       "findings": [{"name": "shifted", "message": "..."}],
                       "probe_norms": {"embed": [0.5, 0.1]}, "explain": "FAULT"},
            "prompts": 16, "explain": "skew doctor: FAULT (shifted)"}
DOCTOR = {"format": "eyas", "says": "eyas_layout", "engine": None, "findings": []}
REFUSED = {"engine": "vllm", "draft": "/d", "parity": None,
           "doctor": {**DOCTOR, "findings": [{"name": "d2t_identity", "message": "..."}]},
           "forced": False}
PARITY_FAILED = {"engine": "vllm", "draft": "/d", "served": "/r/serve/draft", "parity": False,
                 "parity_detail": {"ok": False, "message": "feeds other slots"},
                 "doctor": DOCTOR, "forced": False}
POINT = {"concurrency": 1, "tau": 2.5, "per_position_acceptance": [0.75, 0.5],
         "time_per_token_ms_spec": 3.0, "time_per_token_ms_plain": 4.0, "ratio": 0.75,
         "tokens_per_s_spec": 300.0, "tokens_per_s_plain": 250.0, "lossless": True,
         "requests": 4}
SERVED = {**PARITY_FAILED, "parity": True, "parity_detail": {"ok": True, "message": "ok"},
          "engine_version": "vllm 0.32", "prompts": 4, "num_speculative_tokens": 2,
          "max_new_tokens": 16, "tau": 2.5, "per_position_acceptance": [0.75, 0.5],
          "acceptance": {"drafts": 8}, "time_per_token_ms_spec": 3.0,
          "time_per_token_ms_plain": 4.0, "latency_ratio": 0.75, "speedup": 4 / 3,
          "tokens_per_s_spec": 300.0, "tokens_per_s_plain": 250.0, "lossless": True,
          "sweep": [POINT, {**POINT, "concurrency": 4, "ratio": 0.9}], "boot_s": None}


@pytest.mark.parametrize("cls,stored", [
    (TrainReport, OFFLINE_TRAIN), (TrainReport, ONLINE_TRAIN), (FeederReport, FEEDER),
    (EvaluateReport, EVALUATE), (ServeReport, REFUSED), (ServeReport, PARITY_FAILED),
    (ServeReport, SERVED)], ids=["train", "train-online", "feeder", "evaluate", "serve-refused",
                                 "serve-parity-failed", "serve"])
def test_a_stored_report_reads_and_writes_back_byte_for_byte(cls, stored, tmp_path):
    text = json.dumps(stored, indent=1)
    report = cls.from_dict(json.loads(text))
    assert json.dumps(report.to_dict(), indent=1) == text
    assert report.write(tmp_path).read_text() == text  # what the writer puts on disk
    if hasattr(cls, "read"):
        assert cls.read(tmp_path) == report


def test_what_the_stages_read_are_attributes():
    offline, online = TrainReport.from_dict(OFFLINE_TRAIN), TrainReport.from_dict(ONLINE_TRAIN)
    assert not offline.online and offline.stream is None
    assert online.online and online.stream == StreamNorms(
        norms={"embed": [0.5, 0.25], "block_out:1": [3.5, 1.0]}, norm_tokens=321,
        received_steps=6)
    evaluate = EvaluateReport.from_dict(EVALUATE)
    assert evaluate.heldout.full == [0.5, 0.25] and evaluate.predicted_tau == 1.75
    assert evaluate.verdict.findings == ["shifted"] and not evaluate.verdict.ok
    assert evaluate.verdict.probe_norms == {"embed": [0.5, 0.1]}
    refused, failed = ServeReport.from_dict(REFUSED), ServeReport.from_dict(PARITY_FAILED)
    assert refused.refused and refused.benchmark is None and refused.served is None
    assert not failed.refused and failed.benchmark is None
    served = ServeReport.from_dict(SERVED)
    assert served.benchmark.sweep[1].concurrency == 4 and served.benchmark.sweep[1].ratio == 0.9
    assert served.benchmark.latency_ratio == 0.75


def test_a_report_from_a_newer_writer_still_reads():
    """Keys a later version adds are ignored by this one's reader, not an error."""
    assert TrainReport.from_dict({**OFFLINE_TRAIN, "new_key": 1}).steps == 12
    assert FeederReport.from_dict({**FEEDER, "new_key": 1}).replicas == 2
