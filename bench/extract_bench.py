"""Extraction overhead, measured side by side in one run on the same batches:

  wall time of the extract stage (capture + pack + write + checksums) / bare target forward
  bytes on disk / raw bytes of the stored hidden-state tensors

    python bench/extract_bench.py [config overrides, e.g. experiment=tiny]

Goals: time ratio <= 1.10, bytes ratio <= 1.02. Uses the built-in target by default.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from eyas.run_records import RunDir

from eyas.conversations.prepare import prepare  # noqa: E402
from eyas.extract import (Extraction, blocks_forward, extract_dataset,  # noqa: E402
                          in_process_executor, local_blocks)
from eyas.extract.shards import _batches  # noqa: E402
from eyas.extract.blocks import make_batch  # noqa: E402
from eyas.layout import layout_from_config  # noqa: E402
from eyas.targets import load_tokenizer, resolve_target  # noqa: E402
from workflows.config import load_config  # noqa: E402


def bare_forward(stages, samples, pad_id, batch_tokens) -> float:
    model = stages[0].model
    started = time.perf_counter()
    with torch.no_grad():
        for index in _batches(samples, batch_tokens):
            batch = make_batch([samples[i]["input_ids"] for i in index], pad_id)
            model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        use_cache=False)
    return time.perf_counter() - started


def side_by_side(cfg, prepare_dir: Path, work: Path, rounds: int = 2) -> dict:
    """The extract stage's work in this process (capture, pack, write, checksums) against a
    bare forward of the target over the same batches of `prepare_dir`'s samples, interleaved
    `rounds` times so that drift in machine load hits both alike; the best of each."""
    cfg.extract.probe_samples = 0
    cfg.extract.stages_per_replica = 1
    target = resolve_target(cfg.target)
    tokenizer = load_tokenizer(target.path)
    layout = layout_from_config(target.identity, cfg.extract.layout.draft_inputs,
                                cfg.extract.layout.verifier, cfg.extract.layout.spread)
    samples = [r for split in ("train", "heldout") for r in pq.read_table(
        Path(prepare_dir) / f"{split}.parquet", columns=["input_ids"]).to_pylist()]
    stages = local_blocks(str(target.path), layout.target.num_layers, cfg.extract,
                          cfg.target.dtype)
    forward = blocks_forward(stages)
    pad = tokenizer.pad_token_id or 0
    bare_forward(stages, samples[:8], pad, cfg.extract.batch_tokens)  # warm-up
    bare, full, manifest = [], [], None
    for round_ in range(rounds):
        bare.append(bare_forward(stages, samples, pad, cfg.extract.batch_tokens))
        out = work / f"extract-{round_}"
        started = time.perf_counter()
        manifest = extract_dataset(Extraction(prepare_dir, out, layout, tokenizer, cfg.extract),
                                   in_process_executor(forward, layout, out, cfg.extract, pad))
        full.append(time.perf_counter() - started)
    tokens = sum(len(s["input_ids"]) for s in samples)
    return {"target": layout.describe(), "samples": len(samples), "tokens": tokens,
            "shards": len(manifest["shards"]), "dtype": cfg.extract.dtype,
            "bare_s": min(bare), "extract_s": min(full),
            "bare_tokens_per_s": tokens / min(bare), "extract_tokens_per_s": tokens / min(full),
            "time_ratio": min(full) / min(bare),
            "bytes_ratio": manifest["bytes"] / manifest["tensor_bytes"]}


def main(argv: list[str]) -> None:
    cfg = load_config(argv)
    work = Path(tempfile.mkdtemp(prefix="eyas-bench-"))
    target = resolve_target(cfg.target)
    prepare(cfg.data, load_tokenizer(target.path), RunDir.of(work).prepare, show_progress=False)
    r = side_by_side(cfg, RunDir.of(work).prepare, work)
    print(f"target: {r['target']}")
    print(f"data: {r['samples']} samples, {r['tokens']} tokens, {r['shards']} shards, "
          f"stored dtype {r['dtype']}")
    print(f"bare forward: {r['bare_s']:.2f} s ({r['bare_tokens_per_s']:.0f} tokens/s); "
          f"extraction: {r['extract_s']:.2f} s ({r['extract_tokens_per_s']:.0f} tokens/s)")
    print(f"extraction time / bare forward time = {r['time_ratio']:.3f}  (goal <= 1.10)")
    print(f"bytes on disk / raw tensor bytes   = {r['bytes_ratio']:.4f}  (goal <= 1.02)")


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):  # usage: the docstring
        print(__doc__)
        sys.exit(0)
    main(sys.argv[1:])
