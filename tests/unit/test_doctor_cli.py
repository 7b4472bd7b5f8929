"""`python -m workflows.doctor`: the verdict printed, exit 0 / 1 / 2."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from eyas.extract.reader import ExtractedDataset
from test_evaluate import world  # noqa: F401  (world: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
from workflows import doctor


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    return world(tmp_path_factory)


def _run(w, capsys, *extra):
    code = doctor.main(["--data", str(w.data), "--draft", str(w.draft_dir),
                        "--target", str(w.target), *extra])
    return code, capsys.readouterr()


def test_clean_draft_exits_0(w, capsys, tmp_path):
    code, out = _run(w, capsys, "--json", str(tmp_path / "verdict.json"))
    assert code == doctor.OK, out.out + out.err
    assert out.out.startswith("skew doctor: OK")
    assert json.loads((tmp_path / "verdict.json").read_text())["ok"] is True


def test_engine_features_from_vllm_format_exit_1_with_the_fix(w, capsys, tmp_path):
    sample = ExtractedDataset(w.data, "probe")[0]
    fed = ["block_out:1", "block_out:3", "block_out:5"]
    path = tmp_path / "fed.safetensors"  # as vLLM's extract_hidden_states writes them
    save_file({"hidden_states": torch.stack([sample.slots[n] for n in fed], dim=1).contiguous(),
               "token_ids": sample.input_ids}, str(path))
    code, out = _run(w, capsys, "--features", str(path))
    assert code == doctor.FAULT
    assert "FAULT (missing_embedding)" in out.out
    assert "to_vllm_ids() -> [0, 2, 4]" in out.out


def test_bad_input_exits_2(w, capsys, tmp_path):
    code, out = _run(w, capsys, "--features", str(tmp_path / "nothing.safetensors"))
    assert code == doctor.BAD_INPUT and "no such file" in out.err
    bad = tmp_path / "bad.safetensors"
    save_file({"something": torch.zeros(3)}, str(bad))
    code, out = _run(w, capsys, "--features", str(bad))
    assert code == doctor.BAD_INPUT and "hidden_states" in out.err
    code = doctor.main(["--data", str(tmp_path), "--draft", str(w.draft_dir),
                        "--target", str(w.target)])
    assert code == doctor.BAD_INPUT  # not an extraction directory
    with pytest.raises(SystemExit) as caught:
        doctor.main(["--draft", str(w.draft_dir)])  # argparse: --data is required
    assert caught.value.code == 2
