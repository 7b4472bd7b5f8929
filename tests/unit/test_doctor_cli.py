"""`python -m workflows.doctor`: the verdict printed, exit 0 / 1 / 2."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from eyas.draft.checkpoint import save_draft
from eyas.store.reader import ExtractedDataset


pytestmark = pytest.mark.usefixtures("one_thread")
from workflows import doctor


def _run(trained_world, capsys, *extra):
    code = doctor.main(["--data", str(trained_world.data), "--draft", str(trained_world.draft_dir),
                        "--target", str(trained_world.target), *extra])
    return code, capsys.readouterr()


def test_clean_draft_exits_0(trained_world, capsys, tmp_path):
    code, out = _run(trained_world, capsys, "--json", str(tmp_path / "verdict.json"))
    assert code == doctor.OK, out.out + out.err
    assert out.out.startswith("skew doctor: OK")
    assert json.loads((tmp_path / "verdict.json").read_text())["ok"] is True


def test_engine_features_from_vllm_format_exit_1_with_the_fix(trained_world, capsys, tmp_path):
    sample = ExtractedDataset(trained_world.data, "probe")[0]
    fed = ["block_out:1", "block_out:3", "block_out:5"]
    path = tmp_path / "fed.safetensors"  # as vLLM's extract_hidden_states writes them
    save_file({"hidden_states": torch.stack([sample.slots[n] for n in fed], dim=1).contiguous(),
               "token_ids": sample.input_ids}, str(path))
    code, out = _run(trained_world, capsys, "--features", str(path))
    assert code == doctor.FAULT
    assert "FAULT (missing_embedding)" in out.out
    assert "vLLM ids (eyas.conventions.vllm.to_ids) [0, 2, 4]" in out.out


def _one_eyas_paragraph(err: str) -> str:
    assert err.startswith("eyas: ") and err.count("\n") == 1, err  # one line, no traceback
    return err


def test_bad_input_exits_2_with_one_eyas_paragraph(trained_world, capsys, tmp_path):
    code, out = _run(trained_world, capsys, "--features", str(tmp_path / "nothing.safetensors"))
    assert code == doctor.BAD_INPUT and "no such file" in _one_eyas_paragraph(out.err)
    bad = tmp_path / "bad.safetensors"
    save_file({"something": torch.zeros(3)}, str(bad))
    code, out = _run(trained_world, capsys, "--features", str(bad))
    assert code == doctor.BAD_INPUT and "hidden_states" in _one_eyas_paragraph(out.err)
    code, out = _run(trained_world, capsys, "--data", str(tmp_path))  # the last --data wins
    assert code == doctor.BAD_INPUT  # not an extraction directory
    assert f"{tmp_path}: no manifest.json" in _one_eyas_paragraph(out.err)
    code, out = _run(trained_world, capsys, "--draft", str(tmp_path))
    assert code == doctor.BAD_INPUT and "no draft weights" in _one_eyas_paragraph(out.err)
    with pytest.raises(SystemExit) as caught:
        doctor.main(["--draft", str(trained_world.draft_dir)])  # argparse: --data is required
    assert caught.value.code == 2
    assert "--data" in _one_eyas_paragraph(capsys.readouterr().err)


def test_features_that_are_text_name_the_file_and_the_format(trained_world, capsys, tmp_path):
    text = tmp_path / "fed.txt"
    text.write_text("block_out:1 block_out:3 block_out:5\n")
    code, out = _run(trained_world, capsys, "--features", str(text))
    assert code == doctor.BAD_INPUT
    err = _one_eyas_paragraph(out.err)
    assert f"{text}: not a safetensors file" in err
    assert "`hidden_states` [T, 3, H]" in err and "`draft_inputs` [T, 3*H]" in err
    code, out = _run(trained_world, capsys, "--features", str(text), "--debug")
    assert code == doctor.BAD_INPUT
    assert out.err.startswith("Traceback") and "\neyas: " in out.err


def test_reported_accuracy_overrides_the_drafts_record(trained_world, capsys):
    code, out = _run(trained_world, capsys, "--reported-accuracy", "0.99,0.99,0.99")
    assert code == doctor.FAULT, out.out + out.err
    assert "FAULT (accuracy_gap)" in out.out
    assert "training reported [0.990, 0.990, 0.990] (given with --reported-accuracy)" in out.out
    recorded = ",".join(f"{a:.4f}" for a in trained_world.reported)  # what the draft records: no gap
    code, out = _run(trained_world, capsys, "--reported-accuracy", recorded)
    assert code == doctor.OK, out.out
    with pytest.raises(SystemExit) as caught:
        _run(trained_world, capsys, "--reported-accuracy", "62,55")
    assert caught.value.code == doctor.BAD_INPUT
    assert "fractions in [0, 1]" in _one_eyas_paragraph(capsys.readouterr().err)


def test_a_draft_without_recorded_accuracy_notes_the_gap_unchecked(trained_world, capsys, tmp_path):
    foreign = save_draft(trained_world.draft, trained_world.layout, trained_world.vocab, tmp_path / "foreign")  # no eyas_extra
    code, out = _run(trained_world, capsys, "--draft", str(foreign))
    assert code == doctor.OK, out.out + out.err
    assert ("note: training gap not checked: no reported accuracy (pass --reported-accuracy)"
            in out.out)


class _WritesAFile:
    """Unpickling this creates `path` (what a hostile pytorch_model.bin could do, and worse)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("with_config", [True, False])
def test_a_pickled_draft_is_refused_naming_the_file_and_never_unpickled(
        trained_world, capsys, tmp_path, with_config):
    import shutil

    canary = tmp_path / "unpickled"
    draft = tmp_path / "pickled-draft"
    draft.mkdir()
    if with_config:
        shutil.copy(trained_world.draft_dir / "config.json", draft / "config.json")
    torch.save({"fc.weight": torch.zeros(2, 2), "payload": _WritesAFile(canary)},
               draft / "pytorch_model.bin")
    code, out = _run(trained_world, capsys, "--draft", str(draft))
    assert code == doctor.BAD_INPUT
    err = _one_eyas_paragraph(out.err)
    assert f"{draft / 'pytorch_model.bin'}: a pickle, and eyas never unpickles" in err
    assert "safetensors only" in err and "model.safetensors" in err
    assert not canary.exists()
