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

from eyas.conversations.prepare import prepare  # noqa: E402
from eyas.extract import extract_dataset, in_process_executor, local_blocks, blocks_forward  # noqa: E402
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


def main(argv: list[str]) -> None:
    cfg = load_config(argv)
    cfg.extract.probe_samples = 0
    cfg.extract.stages_per_replica = 1
    target = resolve_target(cfg.target)
    tokenizer = load_tokenizer(target.path)
    layout = layout_from_config(target.identity, cfg.extract.layout.draft_inputs,
                                cfg.extract.layout.verifier)
    work = Path(tempfile.mkdtemp(prefix="eyas-bench-"))
    prepare(cfg.data, tokenizer, work / "prepare", show_progress=False)
    samples = [r for split in ("train", "heldout") for r in pq.read_table(
        work / "prepare" / f"{split}.parquet", columns=["input_ids"]).to_pylist()]
    stages = local_blocks(str(target.path), layout.target.num_layers, cfg.extract,
                          cfg.target.dtype)
    forward = blocks_forward(stages)
    pad = tokenizer.pad_token_id or 0
    bare_forward(stages, samples[:8], pad, cfg.extract.batch_tokens)  # warm-up
    bare, full, manifest = [], [], None
    for round_ in range(2):  # interleaved, so drift in machine load hits both alike
        bare.append(bare_forward(stages, samples, pad, cfg.extract.batch_tokens))
        out = work / f"extract-{round_}"
        started = time.perf_counter()
        manifest = extract_dataset(work / "prepare", out, layout, tokenizer, cfg.extract,
                                   in_process_executor(forward, layout, out, cfg.extract, pad))
        full.append(time.perf_counter() - started)
    tokens = sum(len(s["input_ids"]) for s in samples)
    print(f"target: {layout.describe()}")
    print(f"data: {len(samples)} samples, {tokens} tokens, {len(manifest['shards'])} shards, "
          f"stored dtype {cfg.extract.dtype}")
    print(f"bare forward: {min(bare):.2f} s ({tokens / min(bare):.0f} tokens/s); "
          f"extraction: {min(full):.2f} s ({tokens / min(full):.0f} tokens/s)")
    print(f"extraction time / bare forward time = {min(full) / min(bare):.3f}  (goal <= 1.10)")
    print(f"bytes on disk / raw tensor bytes   = "
          f"{manifest['bytes'] / manifest['tensor_bytes']:.4f}  (goal <= 1.02)")


if __name__ == "__main__":
    main(sys.argv[1:])
