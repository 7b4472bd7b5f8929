"""The store at users' scale: a shard's cost, an open's cost and a worker's memory stay flat as
the number of conversations grows, and a retried shard is not written twice."""
import subprocess

import pytest
import torch

from eyas.store.format import DatasetFormatError
from eyas.store.reader import ExtractedDataset
from eyas.targets import load_tokenizer
from helpers import extract_tiny as _extract
from helpers import prepare_tiny as _prepare
from helpers import flip_last_byte, tiny_store


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_store(tmp_path_factory.mktemp("llama"))



def test_a_retried_shard_that_its_lost_worker_finished_is_not_written_again(llama, tmp_path):
    """A shard task retried after its worker wrote the shard and died before the driver heard
    of it (a node lost at that moment): the shard on disk is returned as it is, no forward run,
    no file rewritten; a damaged one is computed again."""
    from eyas.config import ExtractConfig
    from eyas.extract import blocks_forward, local_blocks, shard_writer
    from eyas.extract.shards import extract_shard, plan_shards

    target, base, _ = llama
    ds = ExtractedDataset(base / "extract")
    cfg = ExtractConfig(dtype="float32", samples_per_shard=8, batch_tokens=512)
    real = blocks_forward(local_blocks(str(target), ds.layout.target.num_layers, cfg, "float32"))
    calls = []

    def forward(*args):
        calls.append(1)
        return real(*args)

    writer = shard_writer(ds.layout, tmp_path, cfg, load_tokenizer(target).pad_token_id)
    spec = plan_shards(base / "prepare", 8)[0]
    first = extract_shard(spec, forward, writer)
    ran = len(calls)
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob(f"{spec.name}.*")}
    again = extract_shard(spec, forward, writer)  # the retry
    assert again == first and len(calls) == ran > 0
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob(f"{spec.name}.*")} == stamps
    flip_last_byte(tmp_path / f"{spec.name}.safetensors")
    assert extract_shard(spec, forward, writer) == first and len(calls) > ran


def test_an_open_reads_no_file_whole_and_a_full_check_is_asked_for(llama, tmp_path,
                                                                   monkeypatch):
    """Opening a store checks each file's presence, size and envelope, never its bytes (at
    users' scale a hash of every file at every open read terabytes); verify="full" hashes
    each file once. A file cut short is refused at the door either way."""
    import eyas.store.reader as reader

    target, base, _ = llama
    hashed = []
    real = reader.sha256_file
    monkeypatch.setattr(reader, "sha256_file", lambda p: hashed.append(p) or real(p))
    ds = ExtractedDataset(base / "extract")
    assert len(ds) > 0 and hashed == []
    files = sum(len(s["files"]) for s in ds.manifest["shards"] if s["split"] == "train")
    ExtractedDataset(base / "extract", verify="full")
    assert len(hashed) == files
    out = tmp_path / "cut"
    subprocess.run(["cp", "-a", str(base / "extract"), str(out)], check=True)
    victim = out / "shard-train-00000.safetensors"
    victim.write_bytes(victim.read_bytes()[:-8])
    with pytest.raises(DatasetFormatError, match=rf"{victim}: .* bytes"):
        ExtractedDataset(out)


def test_token_ids_are_held_in_arrow_columns_not_python_lists(llama, tmp_path):
    """What an open store holds on the Python heap for each further token, measured between a
    store and one ten times its size: the token ids and loss masks stay in the shards' Arrow
    buffers (as lists of Python ints they took about 50 bytes a token, in every training
    worker)."""
    import tracemalloc

    target, _, _ = llama
    for n in (24, 240):  # one train shard each
        _prepare(tmp_path / f"prepare{n}", load_tokenizer(target), n_train=n)
        _extract(target, tmp_path / f"prepare{n}", tmp_path / f"extract{n}",
                 samples_per_shard=256)

    def held(directory):
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            ds = ExtractedDataset(directory)
            return tracemalloc.get_traced_memory()[0] - before, sum(ds.lengths()), ds
        finally:
            tracemalloc.stop()

    small, small_tokens, _ = held(tmp_path / "extract24")
    large, large_tokens, ds = held(tmp_path / "extract240")
    per_token = (large - small) / (large_tokens - small_tokens)
    assert large_tokens > 5 * small_tokens and per_token < 6, (per_token, large, small)
    sample = ds[len(ds) - 1]
    assert sample.input_ids.dtype == torch.long and sample.loss_mask.dtype == torch.bool
    assert len(sample.input_ids) == len(sample.loss_mask) == ds.lengths()[-1]


def test_a_shard_decodes_only_the_row_groups_that_hold_its_rows(tmp_path, monkeypatch):
    """Each shard reads its own rows of the prepared split, not the whole split (which made
    an extraction O(N^2) in the number of conversations); the rows are the ones asked for."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eyas.extract.shards import ShardSpec, load_samples

    source = tmp_path / "train.parquet"
    ids = [[i, i + 1] for i in range(2000)]
    table = pa.table({"sample_id": [f"s:{i}" for i in range(2000)], "input_ids": ids,
                      "loss_mask": [[False, True]] * 2000})
    pq.write_table(table, source, row_group_size=512)
    decoded = []
    for name in ("read_row_groups", "read", "iter_batches"):
        real = getattr(pq.ParquetFile, name)
        monkeypatch.setattr(pq.ParquetFile, name, lambda self, *a, _real=real, **k: (
            lambda t: decoded.append(t.num_rows) or t)(_real(self, *a, **k)))
    real_table = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: (
        lambda t: decoded.append(t.num_rows) or t)(real_table(*a, **k)))
    rows = load_samples(ShardSpec("shard-train-00007", "train", str(source), 1500, 100))
    assert [r["sample_id"] for r in rows] == [f"s:{i}" for i in range(1500, 1600)]
    assert rows[0]["input_ids"] == [1500, 1501]
    assert sum(decoded) <= 2 * 512, decoded  # the groups holding rows 1500..1599, no more


def test_a_shards_norms_are_computed_in_row_chunks_with_the_same_result(tmp_path,
                                                                        monkeypatch):
    """The writer's norm fingerprints over chunks of rows equal one pass over the whole slot
    (which held a float32 copy of it: gigabytes a shard on a 70B target)."""
    import eyas.store.writer as writer
    from eyas.layout import HiddenStateLayout
    from eyas.targets import identify

    target, _, _ = tiny_store(tmp_path / "w")
    layout = HiddenStateLayout.from_names(identify(target), ["embed"])
    samples = [{"sample_id": f"s:{i}", "input_ids": [1] * 50, "loss_mask": [1] * 50}
               for i in range(3)]
    packed = {"embed": torch.randn(150, 32, dtype=torch.bfloat16) * 3,
              "block_out:3": torch.randn(150, 32, dtype=torch.bfloat16)}
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    whole = writer.write_shard(tmp_path / "a", "shard-train-00000", "train", layout, samples,
                               packed)
    monkeypatch.setattr(writer, "NORM_ROWS", 7)
    chunked = writer.write_shard(tmp_path / "b", "shard-train-00000", "train", layout,
                                 samples, packed)
    for slot in packed:
        a, b = whole.norms[slot], chunked.norms[slot]
        assert a.count == b.count == 150
        assert abs(a.mean - b.mean) < 1e-9 and abs(a.std - b.std) < 1e-9


def test_counting_the_vocabulary_reads_no_hidden_state(llama, monkeypatch):
    """The draft vocabulary is counted over every training sample's tokens before training:
    that pass reads the token columns alone. Reading each sample's hidden states for it (an
    FP8 store's dequantized row by row) cost a pass over the whole store, in every worker."""
    import eyas.store.reader as reader
    from eyas.train.data import StoredData

    _, base, _ = llama
    data = StoredData(base / "extract")
    expected = [(s.input_ids.tolist(), s.loss_mask.tolist())
                for s in (data.train[i] for i in range(len(data)))]
    read = []
    real = reader.read_rows
    monkeypatch.setattr(reader, "read_rows", lambda *a: read.append(1) or real(*a))
    rows = [(ids.tolist(), mask.tolist()) for ids, mask in data.token_rows()]
    assert rows == expected and len(rows) == len(data) > 1
    assert read == []


@pytest.mark.parametrize("store", ["tokens memory-mapped", "written before them"])
def test_an_open_store_holds_no_token_column_whole(llama, tmp_path, monkeypatch, store):
    """Arrow's own memory (pa.total_allocated_bytes), between a store and one ten times its
    size, opened with every sample's length read and every sample's tokens read once: the
    tokens are memory-mapped from the shards' safetensors, or in a store written before they
    were stored there, decoded from a shard's Parquet when read and dropped after
    KEEP_DECODED other shards; either way it does not grow with the tokens (the whole store's
    columns took 5 bytes a token in every worker: 1 GB at 2e8 tokens)."""
    import gc

    import pyarrow as pa

    import eyas.store.writer as writer

    monkeypatch.setattr(ExtractedDataset, "KEEP_DECODED", 2, raising=False)  # fewer than either has
    if store == "written before them":
        monkeypatch.setattr(writer, "token_tensors", lambda samples: {})
    target, _, _ = llama
    for n in (24, 240):
        _prepare(tmp_path / f"prepare{n}", load_tokenizer(target), n_train=n)
        _extract(target, tmp_path / f"prepare{n}", tmp_path / f"extract{n}",
                 samples_per_shard=8)

    def held(directory):
        gc.collect()  # what earlier tests left is freed before, not during, the measurement
        before = pa.total_allocated_bytes()
        ds = ExtractedDataset(directory)
        tokens = sum(ds.lengths())
        read = [ds.tokens(i)[0].tolist() for i in range(len(ds))]
        return pa.total_allocated_bytes() - before, tokens, ds, read

    small, small_tokens, _, _ = held(tmp_path / "extract24")
    large, large_tokens, ds, read = held(tmp_path / "extract240")
    assert large_tokens > 5 * small_tokens and len(ds.shards) > 2 * ds.KEEP_DECODED
    assert all((shard.packed is None) == (store == "written before them") for shard in ds.shards)
    assert (large - small) / (large_tokens - small_tokens) < 1, (large, small)
    # what is read is the stored tokens, in order, whichever shards are decoded at the time
    assert read == [ds[i].input_ids.tolist() for i in range(len(ds))]
    assert read[len(ds) // 2] == ds.tokens(len(ds) // 2)[0].tolist()


def _mapped(directory) -> int:
    """How many of the store's files this process has memory-mapped now."""
    import gc

    gc.collect()
    return sum(str(directory) in line for line in open("/proc/self/maps"))


def test_an_open_store_maps_only_the_shards_it_reads_lately(llama, tmp_path, monkeypatch):
    """A store of many shards (the tiny experiment writes 16 samples a shard: 6,121 at 10^5
    conversations) maps no shard at open and at most KEEP_MAPPED at once while every sample
    is read: each shard held mapped with its tensors and index lists cost about 15 KiB, 100 MiB
    of a training worker at 10^5. What is read is what the shard holds, whichever are
    mapped."""
    monkeypatch.setattr(ExtractedDataset, "KEEP_MAPPED", 3, raising=False)
    target, _, _ = llama
    _prepare(tmp_path / "prepare", load_tokenizer(target), n_train=80)
    _extract(target, tmp_path / "prepare", tmp_path / "extract", samples_per_shard=4)
    ds = ExtractedDataset(tmp_path / "extract")
    assert len(ds.shards) >= 10 and _mapped(tmp_path / "extract") == 0
    first = [(s.sample_id, s.input_ids.tolist(), s.slots[ds.layout.names[0]].clone())
             for s in (ds[i] for i in range(len(ds)))]
    assert 0 < _mapped(tmp_path / "extract") <= 3
    again = ExtractedDataset(tmp_path / "extract")
    again.KEEP_MAPPED = len(again.shards)  # every shard mapped: the old reader's view
    for i in reversed(range(len(again))):
        sample = again[i]
        assert (sample.sample_id, sample.input_ids.tolist()) == first[i][:2]
        assert torch.equal(sample.slots[again.layout.names[0]], first[i][2])
    assert len({sid for sid, _, _ in first}) == len(ds) == len(ds.lengths())
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_a_store_is_mapped_for_random_reads(llama):
    """Every mapped shard file is advised MADV_RANDOM (smaps shows `rr`): left to the kernel's
    read-around, a page fault on a store larger than memory read megabytes around each
    sample's rows, and a training epoch read the disk many times over."""
    _, base, _ = llama
    ds = ExtractedDataset(base / "extract")
    sample = ds[len(ds) - 1]
    flags, current = [], None
    for line in open("/proc/self/smaps"):
        if line[:1].isalnum() and "-" in line.split()[0]:  # a mapping's first line
            current = line.split()[-1] if len(line.split()) >= 6 else None
        elif line.startswith("VmFlags:") and current and current.startswith(
                str(base / "extract")):
            flags.append((current, line.split()[1:]))
    assert flags, "no shard file mapped"
    assert all("rr" in f for _, f in flags), flags
    assert sample.slots  # the views of those mappings, still alive here
