"""Errors a person can read: an eyas error raised inside a Ray task reaches the user as one
`eyas:` paragraph with exit 2 (bad input) or 1 (failed check), with no Ray traceback."""
import json

import pytest

from workflows import pipeline

pytestmark = pytest.mark.integration


def test_bad_record_in_a_ray_task_is_one_paragraph(ray_cluster, target_cache, tmp_path, capsys):
    data = tmp_path / "chat.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "hello"}]}
    data.write_text(json.dumps(good) + "\n" + json.dumps({"messages": [
        {"role": "user", "content": "no answer"}]}) + "\n")
    code = pipeline.main(["experiment=tiny", f"run_dir={tmp_path / 'run'}", "stages=[prepare]",
                          f"target.builtin.cache_dir={target_cache}", "data=files",
                          f"data.train_files=[{data}]"])
    err = capsys.readouterr().err
    assert code == 2, err
    paragraph = err[err.index("eyas: "):]  # MLflow's store creation logs come before it
    assert err.count("eyas: ") == 1 and f"{data} line 2" in paragraph, err
    assert "data.on_bad_record=skip" in paragraph
    assert "Traceback" not in err and "Unserializable" not in err and "RayTaskError" not in err


def test_debug_flag_shows_the_traceback(ray_cluster, target_cache, tmp_path, capsys):
    code = pipeline.main(["--debug", "experiment=tiny", f"run_dir={tmp_path}", "stages=[prepare]",
                          f"target.builtin.cache_dir={target_cache}", "data=files",
                          f"data.train_files=[{tmp_path / 'missing.jsonl'}]"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and "missing.jsonl" in err, err


def test_bad_record_found_by_a_tokenizing_task_is_one_paragraph(ray_cluster, target_cache,
                                                                 tmp_path, capsys):
    """A record refused as it is tokenized (its answer past data.max_length), in the Ray task
    that tokenizes its chunk inside the prepare task: still one paragraph naming its line."""
    data = tmp_path / "chat.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "hello"}]}
    long = {"messages": [{"role": "user", "content": "word " * 400},
                         {"role": "assistant", "content": "late"}]}
    data.write_text(json.dumps(good) + "\n" + json.dumps(long) + "\n")
    code = pipeline.main(["experiment=tiny", f"run_dir={tmp_path / 'run'}", "stages=[prepare]",
                          f"target.builtin.cache_dir={target_cache}", "data=files",
                          f"data.train_files=[{data}]", "data.max_length=64"])
    err = capsys.readouterr().err
    assert code == 2, err
    paragraph = err[err.index("eyas: "):]
    assert err.count("eyas: ") == 1 and f"{data} line 2" in paragraph, err
    assert "data.max_length" in paragraph
    assert "Traceback" not in err and "RayTaskError" not in err
