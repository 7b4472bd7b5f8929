"""The run directory's shared records: RUN_DIR/prepare/target.json, as every stage, the doctor,
`eyas compare` and the benchmarks find the target by."""
import pytest

from eyas.run_records import TargetRecord, read_target, target_file, target_path, write_target

# prepare/target.json as eyas wrote it before the record had a module of its own: a run made
# then must read the same and, written again, give the same bytes (prepare's output fingerprint)
EARLIER = ('{\n  "build_report": null,\n  "identity": {\n    "architecture": "LlamaForCausalLM",'
           '\n    "hidden_size": 64\n  },\n  "target_path": "/cache/targets/tiny-0123"\n}')


def test_an_earlier_record_reads_and_writes_back_byte_for_byte(tmp_path):
    (tmp_path / "prepare").mkdir()
    target_file(tmp_path).write_text(EARLIER)
    record = read_target(tmp_path)
    assert record == TargetRecord("/cache/targets/tiny-0123",
                                  {"architecture": "LlamaForCausalLM", "hidden_size": 64})
    again = tmp_path / "again"
    (again / "prepare").mkdir(parents=True)
    write_target(again, record)
    assert target_file(again).read_text() == EARLIER
    assert target_path(again) == "/cache/targets/tiny-0123"


def test_a_run_without_its_prepare_stage_is_named_with_the_fix(tmp_path):
    assert read_target(tmp_path) is None
    with pytest.raises(FileNotFoundError, match=r"prepare/target\.json is missing: run the "
                                                r"prepare stage"):
        target_path(tmp_path)
