"""bench/prepare_ray_data_bench.py's comparison: prepare's task pool and the Ray Data pipeline
write the same rows (a bad record skipped and counted alike by both), and any difference
between the two outputs stops the bench."""
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import prepare_ray_data_bench as bench  # noqa: E402

MAX_LENGTH = 64  # about half the conversations run past it: cut, as prepare cuts them


@pytest.fixture(scope="module")
def one_round(ray_cluster, tmp_path_factory):
    from helpers import tiny_tokenizer

    base = tmp_path_factory.mktemp("ray-data")
    target = base / "tokenizer"
    tiny_tokenizer().save_pretrained(target)
    data = base / "train.jsonl"
    bench.write_conversations(data, 50, [[40, 160, 24, 300], [80, 120]], seed=3)
    with open(data, "a") as f:  # line 51: no assistant turn, skipped by both sides
        f.write(json.dumps({"messages": [{"role": "user", "content": "hi"}], "line": 51}) + "\n")
    return base, bench.one_round(data, base, str(target), MAX_LENGTH, "skip")


def test_both_sides_write_the_same_rows_and_bytes(one_round):
    base, got = one_round
    for side in bench.SIDES:
        assert got[side]["samples"] == 50 and got[side]["skipped"] == {"no_assistant_turn": 1}
        assert got[side]["seconds"] > 0 and got[side]["peak_rss"] > 0
    assert got["same_bytes"]
    table = pq.read_table(base / "ray_data" / "train.parquet")
    assert table["sample_id"].to_pylist() == [f"train:{i}" for i in range(1, 51)]
    assert max(table["num_tokens"].to_pylist()) == MAX_LENGTH and any(
        table["truncated"].to_pylist())
    assert bench.summarize([got, got])["ratio"] == pytest.approx(
        got["ray_data"]["seconds"] / got["pool"]["seconds"])


def _damaged(table: pa.Table, how: str) -> pa.Table:
    rows = table.to_pylist()
    if how == "token":
        rows[7]["input_ids"] = [rows[7]["input_ids"][0] + 1] + rows[7]["input_ids"][1:]
    elif how == "mask":
        rows[7]["loss_mask"] = [1 - m for m in rows[7]["loss_mask"]]
    elif how == "order":
        rows[7], rows[8] = rows[8], rows[7]
    elif how == "dropped":
        del rows[7]
    return pa.Table.from_pylist(rows, schema=table.schema)


@pytest.mark.parametrize("how,said", [("token", "row 7 (train:8): input_ids differs"),
                                      ("mask", "row 7 (train:8): loss_mask differs"),
                                      ("order", "row 7 (train:8): sample_id differs"),
                                      ("dropped", "50 rows from the pool, 49 from Ray Data")])
def test_a_difference_in_one_sides_rows_stops_the_bench(one_round, tmp_path, how, said):
    base, _ = one_round
    pool = base / "pool" / "train.parquet"
    table = pq.read_table(base / "ray_data" / "train.parquet")
    pq.write_table(_damaged(table, how), tmp_path / "damaged.parquet")
    with pytest.raises(bench.RowsDiffer, match=said.replace("(", r"\(").replace(")", r"\)")):
        bench.same_rows(pool, tmp_path / "damaged.parquet")
    pq.write_table(table.replace_schema_metadata(None), tmp_path / "bare.parquet")
    with pytest.raises(bench.RowsDiffer, match="schemas differ"):  # prepare's metadata lost
        bench.same_rows(pool, tmp_path / "bare.parquet")
