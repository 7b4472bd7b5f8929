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
        "warmup": "one request", "engine_version": "vllm 0.32.0", "k": 3, "target": "t",
        "engine_options": {"cpu_threads": 2, "interleave": True}}


def _clean(prov: dict) -> dict:
    """A provenance as a clean checkout writes it (the test may run in a dirty one)."""
    return {**prov, "uncommitted_changes": False}


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
    prov = _clean(record.provenance(["RUN"]))
    good = tmp_path / "good.json"
    record.write(good, [], prov, {"plain": {**SIDE, "k": 0}, "k=3": SIDE})
    assert validate_cli.main([str(good), "--compared", "k"]) == 0
    assert validate_cli.main([str(good)]) == 1  # k differs, and k was not declared compared
    assert "k: plain=0, k=3=3" in capsys.readouterr().err
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"sides": {"a": SIDE, "b": SIDE}, "rows": []}))
    assert validate_cli.main([str(bare)]) == 1
    assert "its provenance lacks commit" in capsys.readouterr().err


def _write(path, sides, prov=None, **kw):
    record.write(path, [], prov or _clean(record.provenance(["RUN"])), sides, **kw)
    return str(path)


def test_a_side_without_the_shared_settings_is_refused(tmp_path, capsys):
    """A record whose sides carry no settings (as peer_speed3's and online's did) passed as
    'differ in nothing'; now each side must carry every shared setting not compared."""
    bare = _write(tmp_path / "bare.json", {"eyas": {"trainer": "eyas"},
                                           "peer": {"trainer": "speculators"}},
                  compared=("trainer",))
    assert validate_cli.main([bare]) == 1
    assert "all 2 sides recorded without prompts" in capsys.readouterr().err
    # a record declaring its own shared settings is held to those
    own = _write(tmp_path / "own.json", {"eyas": {"trainer": "eyas", "data": "d"},
                                         "peer": {"trainer": "speculators", "data": "d"}},
                 compared=("trainer",), shared=("data",))
    assert validate_cli.main([own]) == 0
    other = _write(tmp_path / "other.json", {"eyas": {"trainer": "eyas", "data": "d"},
                                             "peer": {"trainer": "speculators", "data": "e"}},
                   compared=("trainer",), shared=("data",))
    assert validate_cli.main([other]) == 1
    assert "data: eyas='d', peer='e'" in capsys.readouterr().err


def test_a_dirty_tree_is_refused_unless_stated(tmp_path, capsys, monkeypatch):
    sides = {"plain": {**SIDE, "k": 0}, "k=3": SIDE}
    prov = {**record.provenance(["RUN"]), "uncommitted_changes": True}
    dirty = _write(tmp_path / "dirty.json", sides, prov, compared=("k",))
    assert validate_cli.main([dirty]) == 1
    assert "uncommitted changes" in capsys.readouterr().err
    monkeypatch.setenv("EYAS_RECORD_STATED", "a docs-only change on top of the commit")
    prov = {**record.provenance(["RUN"]), "uncommitted_changes": True}
    assert prov["stated"].startswith("a docs-only")
    stated = _write(tmp_path / "stated.json", sides, prov, compared=("k",))
    assert validate_cli.main([stated]) == 0


def test_pooled_records_from_another_target_or_machine_are_refused(tmp_path, capsys):
    prov = _clean(record.provenance(["RUN"]))
    a = _write(tmp_path / "a.json", {"x": {**SIDE, "draft": "1"}, "y": {**SIDE, "draft": "2"}},
               prov, compared=("draft",))
    b = _write(tmp_path / "b.json", {"x": {**SIDE, "draft": "3"}, "y": {**SIDE, "draft": "4"}},
               prov, compared=("draft",))
    assert validate_cli.main([a, b]) == 0
    c = _write(tmp_path / "c.json", {"x": {**SIDE, "draft": "3"}, "y": {**SIDE, "draft": "4"}},
               {**prov, "target": "another digest",
                "machine": {**prov["machine"], "cpu": "another CPU"}}, compared=("draft",))
    assert validate_cli.main([a, c]) == 1
    err = capsys.readouterr().err
    assert "provenance.target" in err and "provenance.machine" in err
    # engine options are compared like every other shared setting
    d = _write(tmp_path / "d.json", {"x": {**SIDE, "draft": "1"}, "y": {
        **SIDE, "draft": "2", "engine_options": {"cpu_threads": 1, "interleave": True}}},
               prov, compared=("draft",))
    assert validate_cli.main([d]) == 1
    assert "engine_options" in capsys.readouterr().err


def test_a_tables_caption_says_whether_its_record_passes(tmp_path):
    sys.path.insert(0, str(BENCH.parent / "docs" / "scripts"))
    import tables

    sides = {"plain": {**SIDE, "k": 0}, "k=3": SIDE}
    good = Path(_write(tmp_path / "good.json", sides, compared=("k",)))
    assert tables.verdict(good, "k") == "`eyas bench validate` passes it."
    prov = {**record.provenance(["RUN"]), "uncommitted_changes": True}
    prov.pop("stated", None)
    dirty = Path(_write(tmp_path / "dirty.json", sides, prov, compared=("k",)))
    assert "**Not validated**" in tables.verdict(dirty, "k")
    assert "uncommitted changes" in tables.verdict(dirty, "k")



DOCS = BENCH.parent / "docs"


@pytest.mark.parametrize("name", sorted(p.name for p in (DOCS / "records").glob("*.json")))
def test_every_record_in_the_docs_passes_validate(name, capsys):
    """What a reader is shown passes `eyas bench validate RECORD` as a reviewer runs it: what
    the record says it compares and which settings its sides must share, nothing assumed."""
    code = validate_cli.main([str(DOCS / "records" / name)])
    assert code == 0, capsys.readouterr().err


def test_the_limits_table_reads_the_training_summary_peer_speed_writes():
    """bench/limits_bench.py hands peer_speed's summary to the docs' limits table: when the
    speed bench gained SpecForge and its ratios were named per peer, the table still read
    `ratio` and the limits bench died at its last line, after 25 minutes, writing no record."""
    import peer_speed
    sys.path.insert(0, str(BENCH.parent / "docs" / "scripts"))
    from tables import RENDER

    rounds = [{"round": 0, "eyas_tokens_per_s": 800.0, "specforge_tokens_per_s": 500.0,
               "speculators_tokens_per_s": 400.0},
              {"round": 1, "eyas_tokens_per_s": 780.0, "specforge_tokens_per_s": 490.0,
               "speculators_tokens_per_s": 380.0}]
    training = peer_speed.summary(rounds, ["specforge", "speculators"], 16, [])
    rows = {"regeneration": [{"replicas": 1, "threads_per_replica": 1, "answers_per_s": 1.6,
                              "tokens_per_s": 174.0}],
            "extraction": {"dtype": "bfloat16", "shards": 2, "extract_tokens_per_s": 850.0,
                           "bare_tokens_per_s": 900.0, "time_ratio": 900 / 850},
            "serving": [{"threads": 2, "ms_per_token_c1": 40.0, "tokens_per_s_c4": 90.0}],
            "training": training}
    line = next(x for x in RENDER["limits"]({"rows": rows}).splitlines()
                if x.startswith("| training"))
    assert "eyas 790 tokens/s" in line
    assert "2.03x speculators' 390 (rounds 2.00–2.05)" in line
    assert "1.60x specforge's 495 (rounds 1.59–1.60)" in line
