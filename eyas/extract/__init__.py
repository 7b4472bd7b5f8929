"""The extract stage: run the target over prepared data, store the layout's hidden states.

`extract_dataset` owns everything but where the work runs: it checks the inputs, takes the
output lock, skips finished shards (checksums verified), hands the rest to an executor (in this
process, or Ray workers in `tasks/extract.py`), then writes the probe set and the manifest.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from eyas.config import ExtractConfig
from eyas.store.format import ShardRecord
from eyas.store.writer import OutputLock, remove_partials, write_manifest
from eyas.extract.shards import (Forward, ShardSpec, ShardWriter, bare_forward_rate,
                                 extract_probe, extract_shard, pending, plan_shards)
from eyas.extract.blocks import TargetBlocks, run_blocks, split_blocks, torch_dtype
from eyas.layout import HiddenStateLayout
from eyas.run_records import MANIFEST_FILE

Executor = Callable[[list[ShardSpec]], Iterable[ShardRecord]]


class ExtractError(RuntimeError):
    pass


def check_inputs(prepare_dir: Path, tokenizer, out_dir: Path) -> dict:
    """Prepared data made with this target's tokenizer and template; a writable output dir."""
    from eyas.conversations.prepare import check_tokenizer_matches

    manifest_path = prepare_dir / MANIFEST_FILE
    if not manifest_path.exists():
        raise ExtractError(f"{manifest_path}: missing; run the prepare stage first")
    manifest = json.loads(manifest_path.read_text())
    check_tokenizer_matches(manifest, tokenizer)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise ExtractError(f"cannot write to {out_dir}: {e.strerror}; choose a writable "
                           "run_dir") from e
    return manifest


@dataclass(frozen=True)
class Extraction:
    """One extraction: the prepared splits in `prepare_dir` through the target, the `layout`'s
    slots stored in `out_dir` as `cfg` says. `model_dtype`: what the target computes in
    (recorded: parity's tolerance follows it). `online_target` (train.source=online): the
    target's path; only the probe set and the manifest are stored, training streams the
    splits' states from the target (eyas/train/stream.py) and evaluation recomputes what it
    scores (eyas.extract.on_demand)."""

    prepare_dir: Path
    out_dir: Path
    layout: HiddenStateLayout
    tokenizer: object
    cfg: ExtractConfig
    model_dtype: str | None = None
    online_target: str | None = None

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id or 0

    @property
    def writer(self) -> ShardWriter:
        return shard_writer(self.layout, self.out_dir, self.cfg, self.pad_id)


def shard_writer(layout: HiddenStateLayout, out_dir, cfg: ExtractConfig, pad_id: int
                 ) -> ShardWriter:
    return ShardWriter(layout, Path(out_dir), torch_dtype(cfg.dtype), pad_id, cfg.batch_tokens)


def stage_count(cfg: ExtractConfig) -> int:
    return cfg.stages_per_replica or max(1, cfg.gpus_per_replica)


def local_blocks(target_dir: str, num_layers: int, cfg: ExtractConfig, model_dtype: str,
                 device: str = "cpu") -> list[TargetBlocks]:
    return [TargetBlocks(target_dir, start, end, device, model_dtype)
            for start, end in split_blocks(num_layers, stage_count(cfg))]


def extract_dataset(job: Extraction, executor: Executor, probe_forward: Forward | None = None,
                    progress: Callable[[ShardRecord], None] | None = None) -> dict:
    """Run `job`: its shards through `executor`, the probe set through `probe_forward` (where
    the shards ran), then the manifest; `progress` hears of each shard written."""
    prepare_dir, out_dir = Path(job.prepare_dir), Path(job.out_dir)
    layout, tokenizer, cfg, online = job.layout, job.tokenizer, job.cfg, job.online_target
    check_inputs(prepare_dir, tokenizer, out_dir)
    started = time.perf_counter()
    with OutputLock(out_dir):
        removed = remove_partials(out_dir)
        # online: the held-out split alone is stored (the trainer's held-out accuracy, evaluate
        # and serve read it from disk; held in memory it grew with the data)
        specs = [s for s in plan_shards(prepare_dir, cfg.samples_per_shard)
                 if online is None or s.split == "heldout"]
        done, todo = pending(specs, out_dir)
        records = list(done)
        for record in executor(todo):
            records.append(record)
            if progress:
                progress(record)
        if probe_forward is not None and cfg.probe_samples > 0:
            records.append(extract_probe(prepare_dir / "heldout.parquet", cfg.probe_samples,
                                         probe_forward, job.writer))
        seconds = time.perf_counter() - started
        new_tokens = sum(r.tokens for r in records if r.split != "probe") - \
            sum(r.tokens for r in done)
        # the target's forward alone over the first new shard's batches (the probe forward
        # runs where the shards ran): what extraction's rate is held against
        bare = (bare_forward_rate(todo[0], probe_forward, tokenizer.pad_token_id or 0,
                                  cfg.batch_tokens)
                if todo and probe_forward is not None else None)
        streamed = None
        if online is not None:
            from eyas.extract.on_demand import online_record
            streamed = online_record(prepare_dir, online, job.model_dtype, cfg, layout,
                                     job.pad_id, records)
        return write_manifest(out_dir, layout, records, cfg.dtype, streamed=streamed,
                              target_dtype=job.model_dtype, extra={
            "resumed_shards": len(done), "removed_partials": removed,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(new_tokens / seconds, 1) if seconds > 0 else 0.0,
            "bare_forward_tokens_per_s": round(bare, 1) if bare else None})


def in_process_executor(forward, layout: HiddenStateLayout, out_dir: Path, cfg: ExtractConfig,
                        pad_id: int) -> Executor:
    """Shards in this process, two in flight: one computed while the other is written."""
    def run(specs):
        lock = threading.Lock()
        with ThreadPoolExecutor(max_workers=2) as pool:
            writer = shard_writer(layout, out_dir, cfg, pad_id)
            futures = [pool.submit(extract_shard, spec, forward, writer, lock) for spec in specs]
            for future in as_completed(futures):
                yield future.result()
    return run


def blocks_forward(stages) -> Forward:
    return lambda batch, slots: run_blocks(stages, batch, slots)
