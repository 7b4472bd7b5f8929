"""The built-in target: builds a loadable, better-than-unigram model; deterministic; cached."""
from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from eyas.config import BuiltinTargetConfig
from eyas.targets.builtin import build_builtin_target, builtin_cache_key, continuation_conversations
from eyas.targets.cache import REPORT_NAME
from eyas.targets.corpus import SourceFile, stdlib_sources

TINY = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2,
            intermediate_size=172, max_position_embeddings=256, seq_len=64, batch_size=8,
            train_steps=120, warmup_steps=10, max_corpus_mb=1.5, heldout_fraction=0.1,
            eval_tokens=5000, seed=0)


def tiny(cache_dir, **overrides) -> BuiltinTargetConfig:
    return BuiltinTargetConfig(**{**TINY, **overrides, "cache_dir": str(cache_dir)})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cfg = tiny(tmp_path_factory.mktemp("cache-a"))
    return cfg, build_builtin_target(cfg, progress=False)


def test_built_directory_loads_and_beats_unigram(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg, target = built
    assert not target.cached
    assert target.path.name == f"builtin-{target.report['cache_key']}"
    assert json.loads((target.path / REPORT_NAME).read_text()) == target.report

    model = AutoModelForCausalLM.from_pretrained(target.path)
    tok = AutoTokenizer.from_pretrained(target.path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.config.vocab_size == len(tok) == 512
    assert not model.config.tie_word_embeddings
    assert model.config.eos_token_id == tok.eos_token_id
    assert target.report["num_parameters"] == sum(p.numel() for p in model.parameters())

    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<s><|user|>\nhi<|end|>\n<|assistant|>\n"

    r = target.report
    assert r["heldout_loss"] < r["unigram_loss"]
    assert r["heldout_ppl"] < r["unigram_ppl"]
    assert 4000 < r["heldout_tokens_scored"] <= cfg.eval_tokens
    assert r["train_tokens_seen"] == cfg.train_steps * cfg.batch_size * cfg.seq_len
    assert r["corpus"]["train_files"] > 0 and r["corpus"]["heldout_files"] > 0
    assert r["builder_version"] >= 1 and r["versions"]["torch"] == torch.__version__

    # Chat answers end with <|end|>, so generation must stop there too.
    assert tok.convert_tokens_to_ids("<|end|>") in model.generation_config.eos_token_id


def test_same_config_is_bit_identical_and_keyed(built, tmp_path):
    cfg, first = built
    stale = tmp_path / f".builtin-{first.report['cache_key']}.tmp-killed"  # a killed build's
    stale.mkdir()
    (stale / "config.json").write_text("{")
    again = build_builtin_target(replace(cfg, cache_dir=str(tmp_path)), progress=False)
    assert not again.cached
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [again.path.name]
    assert again.report["cache_key"] == first.report["cache_key"]
    a = load_file(first.path / "model.safetensors")
    b = load_file(again.path / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (first.path / "tokenizer.json").read_text() == (again.path / "tokenizer.json").read_text()

    fp = stdlib_sources(cfg.heldout_fraction, cfg.max_corpus_mb).fingerprint
    assert builtin_cache_key(cfg, fp) == first.report["cache_key"]
    assert builtin_cache_key(replace(cfg, seed=1), fp) != builtin_cache_key(cfg, fp)
    assert builtin_cache_key(cfg, "other-corpus") != builtin_cache_key(cfg, fp)
    # Where the cache lives does not change what is built.
    assert builtin_cache_key(replace(cfg, cache_dir="/elsewhere"), fp) == builtin_cache_key(cfg, fp)


def test_second_call_comes_from_cache(built):
    cfg, first = built
    weights = first.path / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    t0 = time.perf_counter()
    again = build_builtin_target(cfg, progress=False)
    assert time.perf_counter() - t0 < 3.0
    assert again.cached and again.path == first.path and again.report == first.report
    assert weights.stat().st_mtime_ns == mtime
    # Nothing half-written is left beside the finished build.
    assert [p.name for p in first.path.parent.iterdir() if p.is_dir()] == [first.path.name]


def test_concurrent_builder_waits_for_the_lock_then_uses_the_cache(built, tmp_path):
    cfg, first = built
    key = first.report["cache_key"]
    results = []
    with open(tmp_path / f"builtin-{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another builder is busy with this key
        waiter = threading.Thread(target=lambda: results.append(
            build_builtin_target(replace(cfg, cache_dir=str(tmp_path)), progress=False)))
        waiter.start()
        waiter.join(timeout=2.0)
        assert waiter.is_alive() and not results  # blocked on the lock, not building
        shutil.copytree(first.path, tmp_path / first.path.name)  # the other builder finishes
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert results[0].cached and results[0].path == tmp_path / first.path.name
    assert not list(tmp_path.glob(".builtin-*"))


def test_unwritable_cache_dir_names_dir_and_key(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cfg = tiny(blocker / "cache")
    with pytest.raises(OSError, match=r"target\.builtin\.cache_dir") as err:
        build_builtin_target(cfg, progress=False)
    assert str(blocker / "cache") in str(err.value)


def test_continuation_conversations_shape_and_determinism():
    files = [SourceFile(f"m{i}.py", "\n".join(f"x_{i}_{j} = {j}" for j in range(40)))
             for i in range(3)]
    convs = continuation_conversations(files, 20, prompt_lines=5, completion_lines=3, seed=7,
                                       multi_turn_fraction=1.0)
    assert len(convs) == 20
    for m in convs:
        assert [x["role"] for x in m] == ["user", "assistant", "user", "assistant"]
        assert m[0]["content"].startswith("Continue this Python code:\n```python\n")
        assert m[0]["content"].endswith("\n```")
        assert m[2]["content"] == "Continue."
        # Prompt, answer and follow-up are consecutive lines of one file.
        prompt = m[0]["content"].split("```python\n")[1].rsplit("\n```")[0].splitlines()
        lines = prompt + m[1]["content"].splitlines() + m[3]["content"].splitlines()
        assert len(lines) == 5 + 3 + 3
        i, j = map(int, lines[0].split(" = ")[0].split("_")[1:])
        assert lines == [f"x_{i}_{k} = {k}" for k in range(j, j + 11)]

    assert convs == continuation_conversations(files, 20, 5, 3, seed=7, multi_turn_fraction=1.0)
    assert convs != continuation_conversations(files, 20, 5, 3, seed=8, multi_turn_fraction=1.0)

    single = continuation_conversations(files, 10, 5, 3, seed=0, multi_turn_fraction=0.0)
    assert all([x["role"] for x in m] == ["user", "assistant"] for m in single)
    mixed = continuation_conversations(files, 200, 5, 3, seed=0, multi_turn_fraction=0.5)
    assert {len(m) for m in mixed} == {2, 4}


def test_continuation_conversations_skips_blank_windows():
    text = "\n".join(["a = 1", "b = 2", "c = 3"] + [""] * 30 + ["d = 4", "e = 5", "f = 6"])
    convs = continuation_conversations([text], 50, prompt_lines=2, completion_lines=2, seed=0)
    assert convs
    for m in convs:
        code = m[0]["content"].split("```python\n")[1].rsplit("\n```")[0]
        assert code.strip() and m[1]["content"].strip()
    # Files too short for one window give nothing (and do not loop forever).
    assert continuation_conversations(["x = 1\n"], 5, 12, 8, seed=0) == []


def test_does_not_import_ray_or_mlflow():
    code = ("import sys, eyas.targets.builtin; "
            "print(sorted(m for m in ('ray', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _digests(directory):
    import hashlib
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir()) if p.is_file()}


def test_the_build_records_each_files_size_and_checksum(built):
    from eyas.targets.cache import damage

    _, target = built
    files = target.report["files"]
    assert "model.safetensors" in files and "tokenizer.json" in files and REPORT_NAME not in files
    assert {n: r["sha256"] for n, r in files.items()} == {
        n: d for n, d in _digests(target.path).items() if n != REPORT_NAME}
    assert damage(target.path) is None


def test_a_damaged_cache_is_said_and_rebuilt_and_an_intact_one_reused(built, tmp_path, caplog):
    cfg, first = built
    cfg = replace(cfg, cache_dir=str(tmp_path))
    cached = tmp_path / first.path.name
    shutil.copytree(first.path, cached)
    intact = _digests(cached)
    mtime = (cached / "model.safetensors").stat().st_mtime_ns
    again = build_builtin_target(cfg, progress=False)  # intact: reused as it is
    assert again.cached and again.path == cached and _digests(cached) == intact
    assert (cached / "model.safetensors").stat().st_mtime_ns == mtime

    weights = cached / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    with caplog.at_level("WARNING", logger="eyas.targets.builtin"):
        rebuilt = build_builtin_target(cfg, progress=False)
    said = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith(f"eyas: the cached built-in target {cached} is damaged "
                              "(model.safetensors: ") and "(size check)): rebuilding it" in said[0]
    assert not rebuilt.cached and rebuilt.path == cached
    assert _digests(cached) | {REPORT_NAME: None} == intact | {REPORT_NAME: None}  # same build
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [cached.name]

    # same size, other bytes: the checksum finds it
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    from eyas.targets.cache import damage
    assert damage(cached) == ("model.safetensors: its sha256 is not the one recorded at build "
                              "time (checksum check)")
    # a build from before the record: the safetensors envelope is checked
    report = json.loads((cached / REPORT_NAME).read_text())
    del report["files"]
    (cached / REPORT_NAME).write_text(json.dumps(report))
    assert damage(cached) is None  # a flipped byte inside the data passes the envelope check
    with open(weights, "r+b") as f:
        f.truncate(1000)
    assert damage(cached).startswith("model.safetensors: ") and "safetensors header check" in \
        damage(cached)


def test_a_later_stage_finds_the_recorded_target_damaged_and_has_it_rebuilt(
        built, tmp_path, capsys, monkeypatch):
    """A stage after an earlier invocation's prepare reads the target that prepare recorded:
    damaged since, it is said in one line and rebuilt (a Ray task, here called in process),
    and the stage goes on with the same target; an intact one is read as it is."""
    from dataclasses import asdict

    import tasks.prepare
    import workflows.stages as stages
    from eyas.config import PipelineConfig, TargetConfig
    from eyas.run_records import TargetRecord, write_target
    from eyas.targets import identify

    cfg, first = built
    cfg = replace(cfg, cache_dir=str(tmp_path / "cache"))
    cached = tmp_path / "cache" / first.path.name
    shutil.copytree(first.path, cached)
    intact = _digests(cached)
    run_dir = tmp_path / "run"
    (run_dir / "prepare").mkdir(parents=True)
    write_target(run_dir, TargetRecord(str(cached), asdict(identify(cached)), first.report))
    task = tasks.prepare.rebuild_builtin_target_task._function
    monkeypatch.setattr(tasks.prepare, "rebuild_builtin_target_task",
                        type("InProcess", (), {"remote": staticmethod(task)}))
    monkeypatch.setattr(stages.ray, "get", lambda value: value)
    threads = torch.get_num_threads()

    def state():
        return stages.RunState(PipelineConfig(target=TargetConfig(builtin=cfg)), run_dir,
                               None, None)
    try:
        assert stages.resolved_target(state())[0] == str(cached)
        assert capsys.readouterr().err == ""
        (cached / "tokenizer.json").write_text("{}")
        path, identity = stages.resolved_target(state())
        assert path == str(cached)
        assert _digests(cached) | {REPORT_NAME: None} == intact | {REPORT_NAME: None}
        err = capsys.readouterr().err  # the line, then the build's progress bar
        assert err.splitlines()[0] == (f"eyas: the cached built-in target {cached} is damaged (tokenizer.json: "
                       f"{len('{}')} bytes, its build wrote "
                       f"{first.report['files']['tokenizer.json']['bytes']} (size check)): "
                       "rebuilding it")
    finally:
        torch.set_num_threads(threads)
