"""Online training at users' scale (train.source=online): the prepared rows the driver, every
target replica and every trainer rank open cost the same per conversation at any data size,
and are the rows an offline extraction would store, in the same order."""
import pytest

from eyas.targets import identify, load_tokenizer
from helpers import SLOTS, make_tiny_target
from helpers import prepare_tiny as _prepare


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(target, prepare dirs by train size): the same tiny chats, 24 and 240 of them."""
    base = tmp_path_factory.mktemp("online-scale")
    target = make_tiny_target(base / "target", "llama", layers=4, hidden=32)
    tokenizer = load_tokenizer(target)
    dirs = {}
    for n in (24, 240):
        dirs[n] = base / f"prepare{n}"
        _prepare(dirs[n], tokenizer, n_train=n)
    return target, dirs


def test_a_rank_holds_the_prepared_rows_in_arrow_columns_not_python_lists(world):
    """What a trainer rank's stream (StreamedData) holds on the Python heap for each further
    token once open and read (its length, lengths, token rows, a sample id), measured between
    a prepared split and one ten times its size: the token ids and loss masks stay in Arrow
    buffers (as lists of Python ints they took about 50 bytes a token, in the driver, every
    replica and every rank)."""
    import tracemalloc

    from eyas.layout import HiddenStateLayout
    from eyas.train.stream import StreamedData

    target, dirs = world
    layout = HiddenStateLayout.from_names(identify(target, load_tokenizer(target)), SLOTS)

    def held(prepare_dir):
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            data = StreamedData(layout, prepare_dir, None, None, 1)
            lengths = data.lengths()
            ids, mask = next(iter(data.token_rows()))
            assert len(ids) == len(mask) == lengths[0] and len(data) == len(lengths)
            del ids, mask
            return tracemalloc.get_traced_memory()[0] - before, sum(lengths), data
        finally:
            tracemalloc.stop()

    held(dirs[24])  # first-use caches (imports, Arrow type objects) out of the measure
    small, small_tokens, _ = held(dirs[24])
    large, large_tokens, data = held(dirs[240])
    per_token = (large - small) / (large_tokens - small_tokens)
    print(f"held per further token: {per_token:.2f} bytes ({small}, {large})")
    assert large_tokens > 5 * small_tokens and per_token < 6, (per_token, large, small)
    last = [ids for ids, _ in data.token_rows()][-1]
    assert len(last) == data.lengths()[-1]


def test_lengths_and_totals_decode_no_token_lists(world, monkeypatch):
    """The driver's lengths and held-out count, and the online record's totals, come from the
    num_tokens column: no token list is read for them."""
    import pyarrow.parquet as pq

    from eyas.extract.on_demand import PreparedRows
    from eyas.extract.shards import ShardSpec, load_samples

    _, dirs = world
    asked = []
    real_table, real_read = pq.read_table, pq.ParquetFile.read
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: asked.append(k.get("columns"))
                        or real_table(*a, **k))
    monkeypatch.setattr(pq.ParquetFile, "read", lambda self, *a, **k: asked.append(
        k.get("columns", a[0] if a else None)) or real_read(self, *a, **k))
    train, heldout = PreparedRows(dirs[240], "train"), PreparedRows(dirs[240], "heldout")
    lengths, num_heldout, tokens = train.lengths(), len(heldout), train.num_tokens()
    assert all(c is not None and "input_ids" not in c and "loss_mask" not in c
               for c in asked), asked
    monkeypatch.undo()
    source = dirs[240] / "train.parquet"
    rows = load_samples(ShardSpec("train", "train", str(source), 0, len(train)))
    assert lengths == [len(r["input_ids"]) for r in rows] and tokens == sum(lengths)
    assert num_heldout == 6


def test_the_rows_are_the_ones_an_offline_extraction_reads(world, tmp_path):
    """Row i, a slice and iteration give what `load_samples` gives an offline shard: the same
    sample ids, token ids and loss masks, in the same order, as Python lists (also across the
    row groups of a split written 5 rows a group)."""
    import pyarrow.parquet as pq

    from eyas.extract.on_demand import PreparedRows
    from eyas.extract.shards import ShardSpec, load_samples

    _, dirs = world
    pq.write_table(pq.read_table(dirs[24] / "train.parquet"), tmp_path / "train.parquet",
                   row_group_size=5)
    for directory, split in ((dirs[24], "train"), (dirs[24], "heldout"), (tmp_path, "train")):
        rows = PreparedRows(directory, split)
        source = directory / f"{split}.parquet"
        want = load_samples(ShardSpec(split, split, str(source), 0, len(rows)))
        assert len(rows) == len(want) > 0
        assert [rows[i] for i in range(len(rows))] == want
        assert list(rows) == want and rows[1:4] == want[1:4] and rows[:-1] == want[:-1]
        assert rows[-1] == want[-1] and rows[::2] == want[::2]
        assert rows.sample_ids([2, 0]) == [want[2]["sample_id"], want[0]["sample_id"]]
        assert type(rows[0]["input_ids"]) is list and type(rows[0]["input_ids"][0]) is int
        with pytest.raises(IndexError):
            rows[len(rows)]


def test_a_missing_or_damaged_prepared_split_is_named(tmp_path, world):
    from eyas.extract.on_demand import PreparedRows
    from eyas.store.format import DatasetFormatError

    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'train.parquet'}: no prepared "
                       r"train split; run the prepare stage"):
        PreparedRows(tmp_path, "train")
    (tmp_path / "heldout.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetFormatError, match="unreadable prepared split.*damaged"):
        PreparedRows(tmp_path, "heldout")
