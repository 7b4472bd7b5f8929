"""The stage reports' types: a report reads back and writes out byte for byte (same keys, same
order), whichever branch wrote it; one of another format version, or of none, is refused."""
import json

import pytest

from eyas.evaluate.report import EvaluateReport
from eyas.files import FORMAT_KEY, FormatVersionError
from eyas.serve.report import ServeReport
from eyas.train.report import FeederReport, StreamNorms, TrainReport

# as the stages write them (eyas/train/loop.py, tasks/online.py's Feeder, eyas/evaluate/run.py,
# eyas/serve/run.py), without the format key the writer puts first
OFFLINE_TRAIN = {"draft_dir": "/r/train/draft", "steps": 12, "resumed_from": None,
                 "losses": [2.5, 2.25], "train_accuracy": [0.5, 0.25],
                 "train_accuracy_steps": 6, "train_accuracy_tokens": [40, 38],
                 "heldout_accuracy": [0.5, 0.125], "heldout_full_accuracy": [0.375, 0.125],
                 "tokens_per_s": 1234.5, "stream": None, "precision": "float32"}
ONLINE_TRAIN = {**OFFLINE_TRAIN, "resumed_from": 6, "stream": {
    "norms": {"embed": [0.5, 0.25], "block_out:1": [3.5, 1.0]},
    "norm_tokens": 321, "received_steps": 6}, "precision": "bfloat16"}
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
            "prompts": 16, "explain": "skew doctor: FAULT (shifted)", "profiles": None}
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
         "requests": 4, "with_draft": {"median_tpot_ms": 3.0}, "without_draft": None,
         "spec_decode": None, "partings": None, "ratio_interval": [0.7, 0.9],
         "interleaved": True}
SERVED = {**PARITY_FAILED, "parity": True, "parity_detail": {"ok": True, "message": "ok"},
          "engine_version": "vllm 0.32", "prompts": 4, "num_speculative_tokens": 2,
          "max_new_tokens": 16, "tau": 2.5, "per_position_acceptance": [0.75, 0.5],
          "acceptance": {"drafts": 8}, "time_per_token_ms_spec": 3.0,
          "time_per_token_ms_plain": 4.0, "latency_ratio": 0.75, "speedup": 4 / 3,
          "tokens_per_s_spec": 300.0, "tokens_per_s_plain": 250.0, "lossless": True,
          "sweep": [POINT, {**POINT, "concurrency": 4, "ratio": 0.9}], "boot_s": None,
          "prompt_sets": []}


@pytest.mark.parametrize("cls,stored", [
    (TrainReport, OFFLINE_TRAIN), (TrainReport, ONLINE_TRAIN), (FeederReport, FEEDER),
    (EvaluateReport, EVALUATE), (ServeReport, REFUSED), (ServeReport, PARITY_FAILED),
    (ServeReport, SERVED)], ids=["train", "train-online", "feeder", "evaluate", "serve-refused",
                                 "serve-parity-failed", "serve"])
def test_a_stored_report_reads_and_writes_back_byte_for_byte(cls, stored, tmp_path):
    text = json.dumps(stored, indent=1)
    report = cls.from_dict(json.loads(text))
    assert json.dumps(report.to_dict(), indent=1) == text
    on_disk = json.dumps({FORMAT_KEY: cls.VERSION, **stored}, indent=1)
    assert report.write(tmp_path).read_text() == on_disk  # what the writer puts on disk
    assert cls.read(tmp_path) == report


@pytest.mark.parametrize("cls,stored", [(TrainReport, OFFLINE_TRAIN), (FeederReport, FEEDER),
                                        (EvaluateReport, EVALUATE), (ServeReport, SERVED)],
                         ids=["train", "feeder", "evaluate", "serve"])
def test_a_report_of_another_format_is_refused_naming_the_file_and_the_fix(cls, stored,
                                                                            tmp_path):
    path = tmp_path / cls.FILE
    cls.from_dict(stored).write(tmp_path)
    written = json.loads(path.read_text())
    for damaged, said in (({k: v for k, v in written.items() if k != FORMAT_KEY},
                           f"no {FORMAT_KEY}"),
                          ({**written, FORMAT_KEY: cls.VERSION + 1},
                           f"{FORMAT_KEY} {cls.VERSION + 1}")):
        path.write_text(json.dumps(damaged))
        with pytest.raises(FormatVersionError, match="this eyas reads") as e:
            cls.read(tmp_path)
        assert str(path) in str(e.value) and said in str(e.value)
        assert "new run directory" in str(e.value)
    # the version right, a key gone: refused as not that report, not read as a past shape
    path.write_text(json.dumps({k: v for k, v in written.items()
                                if k != next(iter(stored))}))
    with pytest.raises(FormatVersionError, match=f"not a {cls.__name__}"):
        cls.read(tmp_path)


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
