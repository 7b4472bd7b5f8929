"""Benchmark records: what produced a table travels with it, and a comparison whose sides
differ in more than the thing compared is refused."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import record  # noqa: E402
import validate as validate_cli  # noqa: E402

SIDE = {"prompts": "abc", "max_new_tokens": 64, "dtype": "bfloat16", "concurrency": 1,
        "warmup": "one request", "engine_version": "vllm 0.32.0", "k": 3, "target": "t"}


def test_sides_differing_only_in_what_is_compared_pass_and_anything_else_is_named():
    record.validate({"a": {**SIDE, "draft": "x"}, "b": {**SIDE, "draft": "y"}}, "draft")
    with pytest.raises(record.ComparisonError, match=r"max_new_tokens: a=64, b=128"):
        record.validate({"a": SIDE, "b": {**SIDE, "max_new_tokens": 128}}, "draft")
    with pytest.raises(record.ComparisonError, match=r"prompts: .*dtype: "):
        record.validate({"a": SIDE, "b": {**SIDE, "prompts": "def", "dtype": "float32"}}, "k")
    record.validate({"a": SIDE, "b": {**SIDE, "k": 5}}, "k")


def test_provenance_names_this_checkout_and_digests_change_with_the_weights(tmp_path):
    model = tmp_path / "draft"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    prov = record.provenance(["RUN"], drafts={"d": model}, prompts=[[1, 2], [3]])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True,
                          text=True).stdout.strip()
    assert prov["commit"] == head and prov["versions"]["torch"]
    assert prov["machine"]["usable_cores"] >= 1 and prov["date"]
    before = prov["drafts"]["d"]
    (model / "model.safetensors").write_bytes(b"\0" * 63 + b"\1")  # one byte of the weights
    assert record.digest_dir(model) != before
    assert record.digest_prompts([[1, 2], [3]]) != record.digest_prompts([[1, 2], [4]])


def test_validate_refuses_records_without_provenance_or_with_unequal_sides(tmp_path, capsys):
    prov = record.provenance(["RUN"])
    good = tmp_path / "good.json"
    record.write(good, [], prov, {"plain": {**SIDE, "k": 0}, "k=3": SIDE})
    assert validate_cli.main([str(good), "--compared", "k"]) == 0
    assert validate_cli.main([str(good)]) == 1  # k differs, and k was not declared compared
    assert "k: plain=0, k=3=3" in capsys.readouterr().err
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"sides": {"a": SIDE, "b": SIDE}, "rows": []}))
    assert validate_cli.main([str(bare)]) == 1
    assert "its provenance lacks commit" in capsys.readouterr().err
