"""Extraction without Ray: slot tensors, sharding across stages, format, reader, resume."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from eyas.conventions import hf
from eyas.extract import ExtractError
from eyas.store.format import DatasetFormatError
from eyas.store.reader import ExtractedDataset
from eyas.store.writer import OutputLock
from eyas.extract.shards import probe_slots
from eyas.layout import HiddenStateLayout, LayoutError
from eyas.targets import identify, load_tokenizer
from helpers import SLOTS
from helpers import extract_tiny as _extract
from helpers import make_tiny_target
from helpers import prepare_tiny as _prepare
from helpers import flip_last_byte, tiny_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_store(tmp_path_factory.mktemp("llama"))


def test_stored_slots_equal_hf_at_compiled_indices(llama):
    target, base, manifest = llama
    ds = ExtractedDataset(base / "extract")
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    assert hf.to_indices(ds.layout.draft_inputs, ds.layout.target) == [0, 2, 3]
    for i in (0, len(ds) - 1):
        s = ds[i]
        hs = model(s.input_ids[None], output_hidden_states=True).hidden_states
        for name, index in zip(ds.layout.names, hf.to_indices(ds.layout.draft_inputs, ds.layout.target)):
            torch.testing.assert_close(s.slots[name], hs[index][0], rtol=1e-5, atol=1e-5)
        last = hf.capture(model, s.input_ids[None], [ds.layout.verifier])[ds.layout.verifier]
        torch.testing.assert_close(ds.verifier(s), last[0], rtol=1e-5, atol=1e-5)
        assert ds.draft_inputs(s).shape == (len(s.input_ids), 3 * 32)
    assert manifest["totals"]["train"]["samples"] == len(ds) == 24
    assert len(ExtractedDataset(base / "extract", "heldout")) == 6


def test_split_across_two_stages_writes_the_same_tensors(llama, tmp_path):
    target, base, _ = llama
    _extract(target, base / "prepare", tmp_path / "split", stages=2)
    whole = ExtractedDataset(base / "extract")
    split = ExtractedDataset(tmp_path / "split")
    assert len(whole) == len(split)
    for i in range(len(whole)):
        a, b = whole[i], split[i]
        assert a.sample_id == b.sample_id and torch.equal(a.input_ids, b.input_ids)
        for name in a.slots:
            torch.testing.assert_close(a.slots[name], b.slots[name], rtol=1e-5, atol=1e-5)


def test_manifest_norms_probe_and_bytes(llama):
    _, base, manifest = llama
    norms = manifest["layout"]["norms"]
    assert set(norms) == set(SLOTS) | {"block_out:3"}
    assert all(v[0] > 0 and v[1] >= 0 for v in norms.values())
    assert manifest["bytes"] <= 1.02 * manifest["tensor_bytes"] + 30_000 * len(manifest["shards"])
    probe = ExtractedDataset(base / "extract", "probe")
    assert len(probe) == 4
    assert set(probe[0].slots) == {s.name for s in probe_slots(4)}  # every layer, + final_norm
    assert len(probe[0].slots) == 6
    names = [s["name"] for s in manifest["shards"]]
    for split in ("train", "heldout"):  # numbered per split from 0, none missing
        mine = sorted(n for n in names if n.startswith(f"shard-{split}-"))
        assert mine and mine == [f"shard-{split}-{i:05d}" for i in range(len(mine))]
    assert len(names) == len(set(names)) and all(n.startswith("shard-") for n in names)
    shard = manifest["shards"][0]
    schema = __import__("pyarrow.parquet").parquet.read_schema(
        base / "extract" / f"{shard['name']}.parquet")
    assert json.loads(schema.metadata[b"eyas.layout"])["draft_inputs"] == SLOTS


def test_bytes_on_disk_close_to_raw_tensor_bytes(tmp_path):
    target = make_tiny_target(tmp_path / "t", "llama", layers=4, hidden=128)
    _prepare(tmp_path / "p", load_tokenizer(target), n_train=64, n_heldout=4)
    m = _extract(target, tmp_path / "p", tmp_path / "x", samples_per_shard=64)
    assert m["bytes"] / m["tensor_bytes"] <= 1.02, m["bytes"] / m["tensor_bytes"]


def test_reader_refuses_other_layout_target_and_damaged_files(llama, tmp_path):
    target, base, _ = llama
    ds = ExtractedDataset(base / "extract")
    shifted = HiddenStateLayout.from_names(ds.layout.target, ["block_out:0", "block_out:1",
                                                              "block_out:2"])
    with pytest.raises(LayoutError, match=r"\['block_out:0'.*\['embed'"):
        ExtractedDataset(base / "extract", expect_layout=shifted)
    other = identify(make_tiny_target(tmp_path / "other", "llama", seed=1))
    with pytest.raises(DatasetFormatError, match="another target.*weights"):
        ExtractedDataset(base / "extract", expect_target=other)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(base / "extract"), str(copy)], check=True)
    victim = next(copy.glob("shard-train-00000.safetensors"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(DatasetFormatError, match="checksum mismatch"):
        ExtractedDataset(copy, verify="full")


def test_bad_inputs_are_named(llama, tmp_path):
    target, base, _ = llama
    other_tok = make_tiny_target(tmp_path / "t2", "llama")
    tok = load_tokenizer(other_tok)
    tok.chat_template = tok.chat_template.replace("<|end|>", "<|end|> ")
    tok.save_pretrained(other_tok)
    with pytest.raises(ValueError, match="chat template"):
        _extract(other_tok, base / "prepare", tmp_path / "x")
    with pytest.raises(LayoutError, match="block_out:4 is out of range: the target has 4"):
        _extract(target, base / "prepare", tmp_path / "y", slots=["embed", "block_out:4"])
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.geteuid() != 0:  # root writes anywhere
        with pytest.raises(ExtractError, match="cannot write"):
            _extract(target, base / "prepare", ro / "x")
    with pytest.raises(ExtractError, match="run the prepare stage"):
        _extract(target, tmp_path / "nothing", tmp_path / "z")



def test_resume_skips_finished_and_redoes_damaged(llama, tmp_path):
    target, base, first = llama
    out = tmp_path / "x"
    subprocess.run(["cp", "-a", str(base / "extract"), str(out)], check=True)
    flip_last_byte(out / "shard-train-00001.safetensors")
    parquet = out / "shard-train-00002.parquet"
    parquet.write_bytes(parquet.read_bytes()[:-100])  # cut short: "magic bytes not found"
    (out / "shard-heldout-00000.json").write_text('{"name": "shard-hel')  # a garbled record
    (out / ".tmp-123-shard-train-00002.safetensors").write_bytes(b"partial")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("shard-*")}
    m = _extract(target, base / "prepare", out)
    assert m["resumed_shards"] == len(first["shards"]) - 3
    assert m["removed_partials"] == 1 and not list(out.glob(".tmp-*"))
    rewritten = {name for name, (mtime, _) in before.items()
                 if (out / name).stat().st_mtime_ns != mtime}
    assert rewritten == {f"{shard}.{ext}" for shard in ("shard-train-00001", "shard-train-00002",
                                                        "shard-heldout-00000")
                         for ext in ("safetensors", "parquet", "json")}
    kept = set(before) - rewritten
    assert kept and all((out / name).read_bytes() == before[name][1] for name in kept)
    assert [s["files"] for s in m["shards"]] == [s["files"] for s in first["shards"]]
    assert ExtractedDataset(out).manifest == json.loads((base / "extract" /
                                                         "manifest.json").read_text())


def test_extraction_is_timed_against_a_bare_forward_of_new_shards(llama, tmp_path):
    """The target's forward alone over the first new shard's batches is reported beside the
    extraction's rate; a resumed extraction with nothing new to compute times nothing."""
    target, base, first = llama
    assert first["bare_forward_tokens_per_s"] > 0
    out = tmp_path / "x"
    subprocess.run(["cp", "-a", str(base / "extract"), str(out)], check=True)
    again = _extract(target, base / "prepare", out)
    assert again["resumed_shards"] == len(first["shards"])
    assert again["bare_forward_tokens_per_s"] is None


def test_damaged_files_checks_sizes_and_envelopes_always_checksums_when_asked(llama, tmp_path):
    from eyas.store.format import damaged_files

    _, base, _ = llama
    out = tmp_path / "x"
    subprocess.run(["cp", "-a", str(base / "extract"), str(out)], check=True)
    assert damaged_files(out) == {}
    flip_last_byte(out / "shard-train-00000.safetensors")
    assert damaged_files(out, checksum=lambda path: False) == {}  # a size-keeping change
    assert damaged_files(out) == {"shard-train-00000.safetensors": "its checksum differs from "
                                  "the one recorded when it was written"}
    header = out / "shard-train-00001.safetensors"
    data = header.read_bytes()
    header.write_bytes(data[:8] + b"#" + data[9:])  # the JSON header garbled
    cut = out / "shard-heldout-00000.parquet"
    cut.write_bytes(cut.read_bytes()[:-100])
    (out / "probe.safetensors").unlink()
    found = damaged_files(out, checksum=lambda path: False)
    assert set(found) == {"shard-train-00001.safetensors", "shard-heldout-00000.parquet",
                          "probe.safetensors"}
    assert "unreadable header" in found["shard-train-00001.safetensors"]
    assert "bytes" in found["shard-heldout-00000.parquet"]
    assert found["probe.safetensors"] == "missing"


def test_reader_errors_name_the_damaged_file_and_the_fix(llama, tmp_path):
    target, base, _ = llama
    out = tmp_path / "x"
    subprocess.run(["cp", "-a", str(base / "extract"), str(out)], check=True)
    tensors = out / "shard-train-00001.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-64])
    with pytest.raises(DatasetFormatError, match=rf"{tensors}: .* bytes, but its header places "
                                                 "tensor data up to byte .*damaged; re-run the "
                                                 "pipeline: the damaged shard is redone"):
        # unchecked at the door (verify=False), the shard is refused when it is read
        unchecked = ExtractedDataset(out, verify=False)
        unchecked[unchecked.first[1]]
    parquet = out / "shard-train-00000.parquet"
    parquet.write_bytes(parquet.read_bytes()[:-100])
    with pytest.raises(DatasetFormatError, match=rf"{parquet}: unreadable .*magic bytes.*damaged; "
                                                 "re-run the pipeline: the damaged shard is "
                                                 "redone"):
        ExtractedDataset(out, verify=False)
    with pytest.raises(DatasetFormatError, match=rf"{parquet}: .* bytes, .* when written; the "
                                                 "file changed after extraction: re-run the "
                                                 "pipeline"):
        ExtractedDataset(out)
    prepared = tmp_path / "prepare"
    subprocess.run(["cp", "-a", str(base / "prepare"), str(prepared)], check=True)
    split = prepared / "train.parquet"
    split.write_bytes(split.read_bytes()[:-100])
    with pytest.raises(DatasetFormatError, match=rf"{split}: unreadable prepared split .*"
                                                 "re-run the pipeline: the prepare stage"):
        _extract(target, prepared, tmp_path / "y")


def test_second_run_into_same_directory_refuses(tmp_path):
    with OutputLock(tmp_path):
        with pytest.raises(RuntimeError, match=rf"{tmp_path} is being written by pid {os.getpid()}"):
            with OutputLock(tmp_path):
                pass
    with OutputLock(tmp_path):  # released: usable again
        pass


KILLED_RUN = """
import sys, threading, time
sys.path[:0] = [{root!r}, {tests!r}]
import eyas.store.writer as writer
real = writer.write_shard
said = threading.Lock()  # shards are written from more than one thread: one line each
def slow(*a, **k):
    record = real(*a, **k)
    with said:
        sys.stdout.write(f"wrote {{record.name}}\\n")
        sys.stdout.flush()
    time.sleep(0.5)
    return record
writer.write_shard = slow
import eyas.extract.shards as shards
shards.write_shard = slow
from helpers import SLOTS
from helpers import extract_tiny as _extract
from pathlib import Path
_extract(Path({target!r}), Path({prepare!r}), Path({out!r}))
"""


def test_killed_worker_loses_no_finished_shard(llama, tmp_path):
    target, base, first = llama
    out = tmp_path / "killed"
    script = KILLED_RUN.format(root=str(ROOT), tests=str(ROOT / "tests" / "unit"),
                               target=str(target), prepare=str(base / "prepare"), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    for _ in range(2):
        assert proc.stdout.readline().startswith("wrote")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = sorted(p.stem for p in out.glob("shard-*.json"))
    assert len(finished) >= 2 and not (out / "manifest.json").exists()
    for name in finished:  # every visible shard is complete and intact
        record = json.loads((out / f"{name}.json").read_text())
        from eyas.files import sha256_file
        assert all(sha256_file(out / f) == d for f, d in record["files"].items())
    m = _extract(target, base / "prepare", out)
    assert m["resumed_shards"] >= 2
    assert [s["files"] for s in m["shards"]] == [s["files"] for s in first["shards"]]
    time.sleep(0)


@pytest.mark.parametrize("family,arch", [("qwen3", "Qwen3ForCausalLM"),
                                         ("deepseek_v3", "DeepseekV3ForCausalLM")])
def test_other_target_families_extract_correctly(family, arch, tmp_path):
    target = make_tiny_target(tmp_path / "t", family, layers=4, hidden=32)
    _prepare(tmp_path / "p", load_tokenizer(target), n_train=8, n_heldout=2)
    slots = ["block_out:0", "block_out:1", "block_out:2"]
    _extract(target, tmp_path / "p", tmp_path / "x", slots=slots, stages=2)
    ds = ExtractedDataset(tmp_path / "x")
    assert ds.layout.target.architecture == arch
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    for i in range(len(ds)):
        s = ds[i]
        hs = model(s.input_ids[None], output_hidden_states=True).hidden_states
        for name, index in zip(ds.layout.names, hf.to_indices(ds.layout.draft_inputs, ds.layout.target)):
            torch.testing.assert_close(s.slots[name], hs[index][0], rtol=1e-4, atol=1e-4)


def test_missing_or_non_causal_target_is_named(tmp_path):
    from eyas.targets import TargetError

    with pytest.raises(TargetError, match=r"target.path=.*nowhere: no such directory"):
        identify(tmp_path / "nowhere")
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(TargetError, match=r"\['BertModel'\] is not a causal LM"):
        identify(tmp_path / "enc")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TargetError, match="no config.json"):
        identify(tmp_path / "empty")


def test_full_disk_names_the_cause_and_leaves_no_partial_shard(llama, tmp_path, monkeypatch):
    import errno

    import eyas.files as files

    target, base, _ = llama
    real_open = open
    written = {"n": 0}

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, chunk):
            written["n"] += 1
            if written["n"] > 3:  # the disk fills up partway through a shard
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(chunk)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def full_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        return FullDisk(handle) if "w" in mode and ".tmp-" in str(path) else handle

    monkeypatch.setattr(files, "open", full_open, raising=False)
    out = tmp_path / "x"
    with pytest.raises(OSError, match="No space left on device"):
        _extract(target, base / "prepare", out)
    assert not list(out.glob(".tmp-*"))  # nothing half-written left behind
    for marker in out.glob("shard-*.json"):  # whatever finished before is whole
        record = json.loads(marker.read_text())
        from eyas.files import sha256_file
        assert all(sha256_file(out / f) == d for f, d in record["files"].items())
