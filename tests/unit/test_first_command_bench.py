"""bench/first_command_bench.py reads the commands a docs block gives a user (setup lines, then
`eyas run`) and records every served set at every concurrency level with its offline tau."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import first_command_bench as bench  # noqa: E402


def _page(tmp_path, body: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(f"text\n\n<!-- demo -->\n```bash\n{body}\n```\n\nmore\n")
    return page


def test_a_block_gives_its_setup_lines_and_the_eyas_run_arguments_continued_lines_joined(
        tmp_path):
    page = _page(tmp_path, "python docs/scripts/x.py SETS --count 2\n"
                           "eyas run a=1 \\\n    b=SETS/c.jsonl 'd=[1,4]'")
    assert bench.block_commands(page, "demo") == (
        [["python", "docs/scripts/x.py", "SETS", "--count", "2"]],
        ["a=1", "b=SETS/c.jsonl", "d=[1,4]"])


def test_the_docs_demo_block_is_read_as_the_demo_is_run():
    setup, args = bench.block_commands(ROOT / "docs" / "benchmarks.md", "demo-command")
    assert setup and setup[0][1] == "docs/scripts/demo_prompt_sets.py"
    assert (ROOT / setup[0][1]).exists()
    assert any(a.startswith("serve.prompt_sets.") for a in args)


@pytest.mark.parametrize("body, says", [
    ("rm -rf SETS\neyas run a=1", "not `python SCRIPT"),
    ("python x.py", "does not end in `eyas run"),
])
def test_a_block_that_is_not_setup_then_eyas_run_is_refused_naming_it(tmp_path, body, says):
    with pytest.raises(SystemExit, match=says):
        bench.block_commands(_page(tmp_path, body), "demo")
    with pytest.raises(SystemExit, match="no `<!-- other -->`"):
        bench.block_commands(_page(tmp_path, body), "other")


def test_paths_the_setup_wrote_are_made_absolute_and_nothing_else(tmp_path):
    (tmp_path / "SETS").mkdir()
    (tmp_path / "SETS" / "c.jsonl").write_text("{}\n")
    assert bench._absolute(["s.x=SETS/c.jsonl", "s.y=SETS/none.jsonl", "n=32", "z=/abs/p",
                            "flag"], tmp_path) == [
        f"s.x={tmp_path}/SETS/c.jsonl", "s.y=SETS/none.jsonl", "n=32", "z=/abs/p", "flag"]


def _level(concurrency, ratio):
    return {"concurrency": concurrency, "tau": 2.5, "requests": 8, "ratio": ratio,
            "ratio_interval": [ratio - 0.1, ratio + 0.1], "interleaved": concurrency == 1,
            "lossless": True, "time_per_token_ms_spec": 3.0 * ratio,
            "time_per_token_ms_plain": 3.0, "with_draft": {"p99_tpot_ms": 4.5},
            "without_draft": {"p99_tpot_ms": 5.0, "mean_ttft_ms": 9.0}}


def test_a_served_set_is_recorded_at_every_level_beside_its_offline_tau(tmp_path):
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "speculation_profile.chats.json").write_text(
        json.dumps({"mean_accept_length": 2.75}))
    served = {"name": "chats", "sweep": [_level(1, 0.8), _level(4, 0.9)],
              "acceptance": {"tau_interval": [2.4, 2.6], "drafts": 640,
                             "per_position_rate": [0.7, 0.5, 0.3]}}
    got = bench.served_set(tmp_path, served)
    assert got["offline_tau"] == 2.75 and got["drafts"] == 640
    assert [lv["concurrency"] for lv in got["levels"]] == [1, 4]
    assert [lv["ratio"] for lv in got["levels"]] == [0.8, 0.9]
    assert got["levels"][1]["p99_tpot_ms"] == 4.5 and got["levels"][1]["tpot_ms"] == 2.7
    assert got["levels"][0]["ttft_ms_plain"] == 9.0
    # another set's profile is not this one's: the held-out split reads the unsuffixed file
    assert bench.served_set(tmp_path, {**served, "name": "heldout"})["offline_tau"] is None


def test_each_variant_runs_the_block_with_its_arguments_added_from_nothing_one_side_each(
        tmp_path, monkeypatch):
    page = _page(tmp_path, "eyas run run_dir=runs/demo a=1")
    calls = []

    def timed(setup, args, base, extra):  # what would run, where: not run here
        calls.append((args, base))
        return {"arguments": args, "setup": [], "env": extra, "rc": 0}

    monkeypatch.setattr(bench, "timed", timed)
    monkeypatch.setattr(bench, "CHECKOUT", tmp_path)
    out = tmp_path / "record.json"
    bench.main(["--block", "page.md:demo", "--vary", "b=2", "--vary", "c=3", "d=4",
                "--keep", str(tmp_path / "runs"), "--json", str(out)])
    assert [args for args, _ in calls] == [["a=1"], ["a=1", "b=2"], ["a=1", "c=3", "d=4"]]
    assert len({base for _, base in calls}) == 3  # each its own folder and target cache
    record = json.loads(out.read_text())
    assert [r["arguments"] for r in record["rows"]] == [args for args, _ in calls]
    assert sorted(record["sides"]) == sorted([
        "page.md's demo block, this CPU as it is",
        "page.md's demo block, this CPU as it is, with b=2",
        "page.md's demo block, this CPU as it is, with c=3 d=4"])
