"""Ray adapter of the extract stage: replicas of the target run data-parallel over shards.

A replica is one Ray actor holding the target's first block range; when the replica spans
several devices (`extract.gpus_per_replica` > 1, or `extract.stages_per_replica` > 1 on CPU),
the further block ranges live in child actors, one per device, and the hidden state is handed
from one to the next. Actors restart and retry their task when a worker dies; a shard is
visible only once complete, so a retry redoes at most the shard in flight.
"""
from __future__ import annotations

import threading
from pathlib import Path

import ray

from eyas.config import ExtractConfig
from eyas.conventions.engines import engine_rules
from eyas.extract import Extraction, extract_dataset, shard_writer, stage_count
from eyas.extract.shards import extract_shard
from eyas.extract.blocks import TargetBlocks, split_blocks, torch_dtype
from eyas.layout import HiddenStateLayout

_RETRIES = dict(max_restarts=3, max_task_retries=3)


def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _use_assigned_cpus() -> None:
    import torch
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    torch.set_num_threads(max(1, int(cpus)))


@ray.remote(**_RETRIES)
class BlocksActor:
    def __init__(self, target_dir: str, start: int, end: int, dtype: str):
        _use_assigned_cpus()
        self.stage = TargetBlocks(target_dir, start, end, _device(), dtype)

    def forward(self, batch, hidden, slots):
        return self.stage.forward(batch, hidden, slots)


@ray.remote(**_RETRIES, max_concurrency=2)  # one shard computed while the other is written
class ReplicaActor:
    def __init__(self, target_dir: str, layout: dict, cfg: ExtractConfig, model_dtype: str,
                 out_dir: str, pad_id: int, stage_options: dict):
        _use_assigned_cpus()
        self.layout = HiddenStateLayout.from_dict(layout)
        if engine_rules(cfg.backend).shards_target:  # vLLM: over the replica's GPUs itself
            from eyas.extract.vllm_backend import VllmStage
            self.first = VllmStage(target_dir, self.layout.target.num_layers,
                                   cfg.gpus_per_replica)
            self.rest = []
        else:
            ranges = split_blocks(self.layout.target.num_layers, stage_count(cfg))
            self.first = TargetBlocks(target_dir, *ranges[0], _device(), model_dtype)
            self.rest = [BlocksActor.options(**stage_options).remote(target_dir, s, e,
                                                                    model_dtype)
                         for s, e in ranges[1:]]
        self.cfg, self.out_dir, self.pad_id = cfg, Path(out_dir), pad_id
        self.compute = threading.Lock()
        self.rows = {}  # (prepare_dir, split) -> PreparedRows, opened once (online)

    def forward(self, batch, slots):
        hidden, captured = self.first.forward(batch, None, slots)
        for actor in self.rest:
            hidden, got = ray.get(actor.forward.remote(batch, hidden, slots))
            captured.update(got)
        return captured

    def produce(self, prepare_dir: str, split: str, indices: list[int]):
        """The states of prepared `split`'s samples at `indices`, one object each (online
        training: tasks/online.py asks with num_returns=len(indices))."""
        from eyas.extract.on_demand import PreparedRows, compute_samples

        if (prepare_dir, split) not in self.rows:
            self.rows[(prepare_dir, split)] = PreparedRows(prepare_dir, split)
        rows = self.rows[(prepare_dir, split)]
        with self.compute:
            samples = compute_samples([rows[i] for i in indices], self.forward,
                                      self.layout.slots, torch_dtype(self.cfg.dtype),
                                      self.pad_id, self.cfg.batch_tokens)
        return samples if len(samples) > 1 else samples[0]

    def pid(self) -> int:
        import os
        return os.getpid()

    def run_shard(self, spec):
        return extract_shard(spec, self.forward,
                             shard_writer(self.layout, self.out_dir, self.cfg, self.pad_id),
                             self.compute)


def node_cpus() -> float:
    return max(n["Resources"].get("CPU", 1) for n in ray.nodes() if n["Alive"])


def _actor_options(cfg: ExtractConfig, share: float = 1.0) -> dict:
    """Resources of one stage actor: a GPU share of the replica, or a fair share of `share`
    of a node's CPUs (online: half, the trainer workers have the other half)."""
    stages = 1 if engine_rules(cfg.backend).shards_target else stage_count(cfg)
    if cfg.gpus_per_replica:
        return {"num_gpus": cfg.gpus_per_replica / stages, "num_cpus": 1}
    return {"num_cpus": node_cpus() * share / (cfg.num_replicas * stages)}  # may be fractional


def start_replicas(target_dir: str, layout: HiddenStateLayout, cfg: ExtractConfig,
                   model_dtype: str, out_dir: Path, pad_id: int, cpu_share: float = 1.0):
    options = _actor_options(cfg, cpu_share)
    from tasks.cluster import spread
    return [ReplicaActor.options(**options, **spread()).remote(
        target_dir, layout.to_dict(), cfg, model_dtype, str(out_dir), pad_id, options)
        for _ in range(cfg.num_replicas)]


def run_extraction(target_dir: str, job: Extraction, on_shard=None) -> dict:
    """`job` (eyas.extract.Extraction) on replicas of the target in `target_dir`."""
    replicas = start_replicas(target_dir, job.layout, job.cfg, job.model_dtype, job.out_dir,
                              job.pad_id)

    def executor(specs):
        queue, running = list(specs), {}
        while queue or running:
            for replica in replicas:  # two shards in flight per replica (write-behind)
                while queue and list(running.values()).count(replica) < 2:
                    running[replica.run_shard.remote(queue.pop(0))] = replica
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                running.pop(ref)
                yield ray.get(ref)

    def probe_forward(batch, slots):  # after every shard: nothing else runs then
        return ray.get(replicas[0].forward.remote(batch, slots))

    try:
        return extract_dataset(job, executor, probe_forward, on_shard)
    finally:
        for replica in replicas:
            ray.kill(replica)

