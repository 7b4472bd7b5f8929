"""`eyas compare`'s inputs and its table (workflows/compare.py); the command end to end, with
vLLM, is tests/integration/test_foreign_serve.py."""
import pytest

from eyas.serve.report import ServeBenchmark, ServeReport, SetResult, SweepPoint
from workflows import compare
from workflows.config import ConfigError


def test_arguments_are_keys_the_command_knows(tmp_path):
    run, out, drafts, sets, over = compare._parse([
        f"run_dir={tmp_path}", "draft.a=/x", "serve.prompt_sets.chat=c.jsonl",
        "serve.num_prompts=2"])
    assert out is None
    assert run == tmp_path and drafts == {"a": "/x"} and over == ["serve.num_prompts=2"]
    assert sets["chat"].endswith("c.jsonl")
    with pytest.raises(ConfigError, match=r"prompt_set.chat: a prompt set is "
                                          r"serve.prompt_sets.chat=FILE"):  # one spelling
        compare._parse([f"run_dir={tmp_path}", "prompt_set.chat=c.jsonl"])
    with pytest.raises(ConfigError, match="trian: not a key"):
        compare._parse([f"run_dir={tmp_path}", "trian=1"])
    with pytest.raises(ConfigError, match="run_dir=RUN is required"):
        compare._parse(["draft.a=/x"])
    assert compare.main([f"run_dir={tmp_path}"]) == 2  # not a run: no config.yaml


def _point(c, tpot_spec, tpot_plain, tau):
    return SweepPoint(c, tau, [0.6, 0.4], 1.0, 1.0, 1.0, 1.0, 1.0, True, 4,
                      {"mean_tpot_ms": tpot_spec}, {"mean_tpot_ms": tpot_plain}, None)


def _report(tau, tpot):
    sets = [SetResult(name, "src", 2, [_point(1, tpot, 10.0, tau), _point(4, tpot * 2, 10.0, tau)],
                      {"tau_interval": [tau - 0.1, tau + 0.3]}, "p.json")
            for name in ("heldout", "chat")]
    bench = ServeBenchmark("vllm x", 2, 2, 8, tau, [0.6, 0.4], {}, 1, 1, 1, 1, 1, 1, True,
                           sets[0].sweep, None, sets)
    return ServeReport("vllm", "d", True, {}, False, "d", {}, bench)


def test_the_table_puts_each_draft_beside_the_target_alone_per_set_and_level():
    text = compare.table({"mine": _report(2.5, 8.0), "theirs": _report(1.5, 12.0)},
                         {"broken": "parity failed"})
    assert text.count("| target alone | | | 10.00 | 1.00 | 10.00 | 1.00 |") == 2
    assert "| mine | 2.50 ± 0.20 | 0.60/0.40 | 8.00 | 0.80 | 16.00 | 1.60 |" in text
    assert "| theirs | 1.50 ± 0.20 | 0.60/0.40 | 12.00 | 1.20 | 24.00 | 2.40 |" in text
    assert "### heldout" in text and "### chat" in text
    assert "- broken: not benchmarked: parity failed" in text
