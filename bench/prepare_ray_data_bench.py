"""Ray Data against prepare's task pool: the same conversations tokenized by the prepare stage's
chunked Ray tasks and by a Ray Data pipeline, alternated over rounds on one local Ray cluster,
their outputs checked to hold the same rows.

    eyas bench prepare-ray-data OUT_DIR [--conversations 20000] [--repeats 3] [--json PATH]

OUT_DIR gets N synthetic conversations (bench/scale_bench.py's: ShareGPT's turn lengths times
1/8, filled with random words) in one JSONL file, tokenized for the built-in tiny target
(experiment=tiny: its tokenizer, data.max_length, bad records skipped and counted) by

  pool      what the prepare stage runs when not regenerating: eyas's prepare_split over the
            file, its chunks of CHUNK records handed to tasks/prepare.py's pool of
            tokenize_part_task, then merged into the split's Parquet file
  ray_data  ray.data.read_json(lines=True) -> map_batches (CHUNK rows a batch) calling eyas's
            own normalize_messages and tokenize_conversation per row -> the batches, in order,
            written as prepare writes its split (same schema, metadata, row groups)

Each side runs inside one 1-CPU Ray task, as prepare_task does (that process's peak resident
memory is recorded); Ray starts with 2 CPUs, so each side has the one left to tokenize on, as
the stage has on 2 cores. Two untimed warm-up rounds on WARMUP conversations (every worker has
imported and loaded what both sides use), then --repeats rounds of pool then ray_data, timed
from the tokenizer loaded to the split's file written and hashed; after every round the two
files must hold identical rows (ids, token ids, masks, counts, in order) under the same schema
and metadata, or the bench stops (RowsDiffer). Printed: each side's seconds, ray_data over pool
per round, the median with the rounds' min-max; recorded also the 1-minute load average before
and after the timed rounds (other work on the machine slows both sides, alike or not).

Ray Data's JSON reader knows no line numbers, which prepare names its samples by ("train:17"):
the file carries each record's line in a `line` field for the ray_data side (the pool ignores
it), where a user's file would not.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT / "bench"))
sys.path.insert(0, str(CHECKOUT))

from scale_bench import SCALE, synthetic, turn_lengths  # noqa: E402

if __name__ != "__main__":  # imported (a test): Ray workers get these functions by value
    import ray.cloudpickle
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SIDES = ("pool", "ray_data")
CLUSTER_CPUS = 2
WARMUP = 1024  # conversations of each untimed warm-up round
ON_BAD_RECORD = "skip"  # a synthetic first turn may outrun max_length: counted, as scale_bench


class RowsDiffer(AssertionError):
    """The two sides' outputs differ: the comparison is void."""


def write_conversations(path: Path, count: int, lengths, seed: int) -> None:
    """`count` synthetic conversations, one a line, each with its 1-based `line`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for line, row in enumerate(synthetic(count, lengths, seed, SCALE), 1):
            f.write(json.dumps({**row, "line": line}) + "\n")


def tiny_target() -> tuple[str, int]:
    """The built-in tiny target's directory (built once into ~/.cache/eyas, as `eyas run
    experiment=tiny` builds it) and experiment=tiny's data.max_length."""
    from eyas.targets import resolve_target
    from workflows.config import load_config

    cfg = load_config(["experiment=tiny"])
    return str(resolve_target(cfg.target).path), cfg.data.max_length


def pool_side(data: str, out: str, target_dir: str, max_length: int, on_bad_record: str) -> dict:
    """prepare's tokenizing as the stage runs it: prepare_split with tasks/prepare.py's pool."""
    from eyas.conversations.prepare import prepare_split
    from tasks.prepare import _pool
    from eyas.targets import load_tokenizer

    tokenizer = load_tokenizer(target_dir)  # prepare_task loads it before prepare, untimed
    started = time.perf_counter()
    submit, width = _pool(target_dir)
    stats = prepare_split([data], tokenizer, max_length, on_bad_record, out, "train",
                          show_progress=False, submit=submit, width=width)
    return {"seconds": time.perf_counter() - started, "width": width,
            **{k: stats[k] for k in ("samples", "tokens", "skipped", "sha256")}}


def tokenize_batch(batch, source: str, target_dir: str, max_length: int, on_bad_record: str):
    """One Ray Data batch (pyarrow: messages, line) -> prepare's columns, a row per record read;
    a skipped record's row has its reason in `skipped` (else null) and no tokens."""
    import pyarrow as pa

    from eyas.conversations.chunks import SCHEMA
    from eyas.conversations.loss_mask import tokenize_conversation
    from eyas.conversations.records import (BadRecordError, InvalidRecord, describe,
                                            normalize_messages, report_bad)
    from tasks.prepare import _tokenizer  # the pool's per-worker cache: both sides load alike

    tokenizer, label = _tokenizer(target_dir), Path(source).stem
    columns = {name: [] for name in (*SCHEMA.names, "skipped")}
    for row in batch.to_pylist():
        try:
            ids, mask, truncated = tokenize_conversation(normalize_messages(row), tokenizer,
                                                         max_length)
            reason = None
        except InvalidRecord as e:  # raised here when on_bad_record="error", as the pool does
            report_bad(BadRecordError(describe(source, row["line"]), e.reason, str(e)),
                       on_bad_record, Counter())
            ids, mask, truncated, reason = [], [], False, e.reason
        for name, value in zip(columns, (f"{label}:{row['line']}", ids, mask, len(ids),
                                         sum(mask), truncated, reason)):
            columns[name].append(value)
    return pa.table(columns, schema=SCHEMA.append(pa.field("skipped", pa.string())))


def ray_data_side(data: str, out: str, target_dir: str, max_length: int,
                  on_bad_record: str) -> dict:
    """read_json -> map_batches(tokenize_batch) -> one Parquet file, as prepare writes it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import ray.data

    from eyas.conversations.chunks import CHUNK, SCHEMA, WRITE_BATCH
    from eyas.conversations.prepare import FORMAT
    from eyas.files import atomic_path, sha256_file
    from eyas.fingerprint import chat_template_fingerprint, tokenizer_fingerprint
    from eyas.targets import load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    started = time.perf_counter()  # prepare_split's fingerprints are timed on the pool side
    metadata = {b"eyas.format": FORMAT.encode(), b"eyas.split": b"train",
                b"eyas.tokenizer_fingerprint": tokenizer_fingerprint(tokenizer).encode(),
                b"eyas.chat_template_fingerprint":
                    chat_template_fingerprint(tokenizer).encode(),
                b"eyas.max_length": str(max_length).encode()}
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # prepare's rows are in file order
    context.enable_progress_bars = False  # as the pool side runs (show_progress=False)
    ds = ray.data.read_json(data, lines=True).map_batches(
        tokenize_batch, batch_size=CHUNK, batch_format="pyarrow",
        fn_kwargs=dict(source=data, target_dir=target_dir, max_length=max_length,
                       on_bad_record=on_bad_record))
    skipped, samples, tokens = Counter(), 0, 0
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(Path(out)) as tmp, \
            pq.ParquetWriter(str(tmp), SCHEMA.with_metadata(metadata)) as writer:
        pending = pa.table({n: [] for n in SCHEMA.names}, schema=SCHEMA)
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            skipped.update(r for r in batch["skipped"].to_pylist() if r is not None)
            kept = batch.filter(pc.is_null(batch["skipped"])).select(SCHEMA.names).cast(SCHEMA)
            samples += kept.num_rows
            tokens += pc.sum(kept["num_tokens"]).as_py() or 0
            pending = pa.concat_tables([pending, kept])
            while pending.num_rows >= WRITE_BATCH:  # row groups as prepare's merge cuts them
                writer.write_table(pending.slice(0, WRITE_BATCH).combine_chunks())
                pending = pending.slice(WRITE_BATCH)
        if pending.num_rows:
            writer.write_table(pending.combine_chunks())
    sha256 = sha256_file(Path(out))  # as prepare_split hashes its split
    return {"seconds": time.perf_counter() - started, "batch_size": CHUNK, "samples": samples,
            "tokens": tokens, "skipped": dict(sorted(skipped.items())), "sha256": sha256}


def _in_seat(side: str, *args) -> dict:
    """`side` in a 1-CPU task (prepare_task's seat); the seat process's peak resident memory
    while it ran (sampled every 20 ms) and that peak over its memory when it began (the
    worker is reused: what it imported for earlier rounds is in both)."""
    import threading

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    start = rss()
    peak, done = [start], threading.Event()

    def sample():
        while not done.wait(0.02):
            peak[0] = max(peak[0], rss())
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = {"pool": pool_side, "ray_data": ray_data_side}[side](*args)
    finally:
        done.set()
        sampler.join()
    peak = max(peak[0], rss())
    return {**result, "peak_rss": peak, "rss_growth": peak - start}


def run_side(side: str, data: Path, out_dir: Path, target_dir: str, max_length: int,
             on_bad_record: str = ON_BAD_RECORD) -> dict:
    """One side over `data` into out_dir/SIDE/train.parquet (the folder emptied first)."""
    import ray

    shutil.rmtree(out_dir / side, ignore_errors=True)
    seat = ray.remote(num_cpus=1, max_retries=0)(_in_seat)
    return ray.get(seat.remote(side, str(data), str(out_dir / side / "train.parquet"),
                               target_dir, max_length, on_bad_record))


def same_rows(pool_file: Path, ray_data_file: Path) -> None:
    """Raise RowsDiffer, naming the first difference, unless the two files hold the same rows
    in the same order (every column) under the same schema and metadata."""
    import pyarrow.parquet as pq

    a, b = pq.read_table(pool_file), pq.read_table(ray_data_file)
    if a.schema != b.schema or a.schema.metadata != b.schema.metadata:
        raise RowsDiffer(f"schemas differ:\n{a.schema}\n--- against ---\n{b.schema}")
    if a.num_rows != b.num_rows:
        raise RowsDiffer(f"{a.num_rows} rows from the pool, {b.num_rows} from Ray Data")
    for name in a.schema.names:
        x, y = a[name].to_pylist(), b[name].to_pylist()
        if x != y:
            i = next(i for i, (u, v) in enumerate(zip(x, y)) if u != v)
            raise RowsDiffer(f"row {i} ({a['sample_id'][i]}): {name} differs: pool "
                             f"{str(x[i])[:80]}, Ray Data {str(y[i])[:80]}")


def one_round(data: Path, out_dir: Path, target_dir: str, max_length: int,
              on_bad_record: str = ON_BAD_RECORD) -> dict:
    """Both sides, pool first, then their outputs compared (RowsDiffer when they differ)."""
    got = {side: run_side(side, data, out_dir, target_dir, max_length, on_bad_record)
           for side in SIDES}
    same_rows(out_dir / "pool" / "train.parquet", out_dir / "ray_data" / "train.parquet")
    for key in ("samples", "tokens", "skipped"):
        if got["pool"][key] != got["ray_data"][key]:
            raise RowsDiffer(f"{key}: pool {got['pool'][key]}, Ray Data {got['ray_data'][key]}")
    got["same_bytes"] = got["pool"]["sha256"] == got["ray_data"]["sha256"]
    return got


def start_ray(num_cpus: int = CLUSTER_CPUS) -> None:
    """A local cluster whose workers import eyas, tasks/ and this file as the driver does."""
    import ray

    path = [str(CHECKOUT), str(CHECKOUT / "bench"), os.environ.get("PYTHONPATH", "")]
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", configure_logging=True,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, path))}})


def summarize(rounds: list[dict]) -> dict:
    ratios = [r["ray_data"]["seconds"] / r["pool"]["seconds"] for r in rounds]
    return {"ratio": statistics.median(ratios), "ratio_interval": [min(ratios), max(ratios)],
            "ratios": ratios}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for the conversations and both outputs")
    p.add_argument("--conversations", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the record here")
    a = p.parse_args(argv)
    out = a.out.resolve()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    lengths = turn_lengths()
    data, warm = out / "train.jsonl", out / "warmup" / "train.jsonl"
    write_conversations(data, a.conversations, lengths, a.seed)
    write_conversations(warm, min(WARMUP, a.conversations), lengths, a.seed + 1)
    target_dir, max_length = tiny_target()
    start_ray()
    for _ in range(2):  # both workers have run both sides: imports and tokenizers loaded
        one_round(warm, out / "warmup", target_dir, max_length)
    rounds, load_before = [], os.getloadavg()[0]  # a shared machine's other work, said
    for i in range(a.repeats):
        got = one_round(data, out, target_dir, max_length)
        rounds.append(got)
        print(f"round {i + 1}: pool {got['pool']['seconds']:.2f} s, Ray Data "
              f"{got['ray_data']['seconds']:.2f} s, ratio "
              f"{got['ray_data']['seconds'] / got['pool']['seconds']:.3f}; seat's peak RSS MiB "
              f"{got['pool']['peak_rss'] / 2**20:.0f} / {got['ray_data']['peak_rss'] / 2**20:.0f}"
              f" (grew {got['pool']['rss_growth'] / 2**20:.0f} / "
              f"{got['ray_data']['rss_growth'] / 2**20:.0f})"
              f"; same rows, same bytes: {got['same_bytes']}", flush=True)
    first = rounds[0]["pool"]
    rows = {"conversations": a.conversations, "samples": first["samples"],
            "tokens": first["tokens"], "skipped": first["skipped"],
            "same_bytes": all(r["same_bytes"] for r in rounds), **summarize(rounds),
            "load_average_1min": [load_before, os.getloadavg()[0]],
            "rounds": [{side: {k: r[side][k] for k in ("seconds", "peak_rss", "rss_growth")}
                        for side in SIDES} for r in rounds]}
    print(f"Ray Data over the pool: median {rows['ratio']:.3f} "
          f"(min-max {rows['ratio_interval'][0]:.3f}-{rows['ratio_interval'][1]:.3f}) over "
          f"{a.repeats} rounds; {rows['samples']} samples, {rows['tokens']} tokens")
    if a.json:
        from record import provenance, write
        shared = {"conversations": a.conversations, "scale": SCALE, "seed": a.seed,
                  "max_length": max_length, "on_bad_record": ON_BAD_RECORD,
                  "cluster_cpus": CLUSTER_CPUS, "seat_cpus": 1}
        how = {"pool": {"width": first["width"]},
               "ray_data": {"batch_size": rounds[0]["ray_data"]["batch_size"]}}
        write(a.json, rows, provenance(argv, target=target_dir),
              {side: {"path": side, **shared, **how[side]} for side in SIDES},
              compared=("path",), shared=tuple(shared))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
