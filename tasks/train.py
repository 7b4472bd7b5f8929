"""Ray adapter of the train stage: Ray Train's TorchTrainer runs eyas' training loop on
`train.num_workers` workers (process group over gloo on CPU, NCCL on GPU); rank 0 logs to the
stage's MLflow child run and writes checkpoints and the draft. Online (train.source=online),
the workers read a stream from target replicas (tasks/online.py) instead of stored shards."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from eyas.config import DraftConfig, TrainConfig
from eyas.train import stop

WORKER_RESTARTS = 2  # times a Ray Train worker group is restarted after a worker dies
from eyas.train.stream import OnlineStream


@dataclass(frozen=True)
class TrainJob:
    """What every Ray Train worker runs (`_loop`, the one entry of its train_loop_config)."""

    data_dir: str  # run_dir/extract (online: the probe set and the manifest only)
    target_dir: str
    out_dir: str
    train: TrainConfig
    draft: DraftConfig
    # rank 0 logs (step, metrics) with it, if given: the stage's MLflow run (the driver's
    # workflows.tracking.WorkerLog, which keeps them in a file when the store is gone)
    log: Callable[[int, dict], None] | None = None
    log_every: int = 5  # steps between logged metrics
    online: OnlineStream | None = None  # set: the data is streamed, not read from data_dir
    threads: int | None = None  # torch threads per worker (None: the CPUs shared out)


def all_gather(t, world: int, device: str) -> list:
    """Every rank's 1-D tensor `t` (lengths may differ), in rank order, on the CPU, over the
    process group (gloo or NCCL, on `device`): the lengths first, then the tensors padded to
    the longest (all_gather takes equal shapes). Every rank must call it (a collective)."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return [t]
    size = torch.tensor([t.numel()], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    sizes = [int(n) for n in sizes]
    padded = torch.zeros(max(sizes), dtype=t.dtype, device=device)
    padded[:t.numel()] = t.to(device)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return [p[:n].cpu() for p, n in zip(parts, sizes)]


def _loop(config: dict) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    from eyas.train.loop import Worker, train_draft

    job: TrainJob = config["job"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(job.threads)))
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def all_reduce(t):
        if world > 1:
            t = t.to(device)
            dist.all_reduce(t)
        return t.cpu() if t.device.type != "cpu" else t

    log = None
    if rank == 0 and job.log is not None:
        every = max(1, job.log_every)

        def log(step, metrics):
            if step % every == 0:
                job.log(step, {k: float(v) for k, v in metrics.items()})

    data = job.data_dir
    if job.online is not None:
        from tasks.online import streamed_data

        data = streamed_data(job.online, job.train.batch_size, job.data_dir)
    outcome = train_draft(data, job.target_dir, job.out_dir, job.train, job.draft,
                          Worker(rank, world, all_reduce, device,
                                 lambda t: all_gather(t, world, device)), log)
    ray.train.report({"steps": outcome.steps})


def run_training(job: TrainJob, use_gpu: bool = False) -> None:
    """`job` on Ray Train workers. With `job.online`, the stream to read (tasks/online.py), the
    workers take half the CPUs, the target replicas the other half."""
    from ray.train import FailureConfig, LoggingConfig, RunConfig, ScalingConfig

    from tasks.cluster import placement

    from eyas.progress import verbose
    from ray.train.torch import TorchConfig, TorchTrainer

    train, online, out_dir = job.train, job.online, Path(job.out_dir)
    cpus = os.cpu_count() or 1
    if online is not None and not use_gpu:
        cpus = max(1, cpus // 2)
    threads = job.threads or max(1, cpus // train.num_workers)
    job = replace(job, threads=threads)
    trainer = TorchTrainer(
        _loop,
        train_loop_config={"job": job},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=train.num_workers, use_gpu=use_gpu,
                                     placement_strategy=placement(),
                                     resources_per_worker=None if use_gpu else
                                     {"CPU": min(1, threads) if online is None else
                                      min(1, cpus / train.num_workers)}),
        # a worker that dies (its node lost, OOM-killed, kill -9) restarts the group, which
        # resumes from the newest checkpoint in out_dir (online: the stream rewinds to it)
        run_config=RunConfig(name="train", storage_path=str(out_dir / "ray"),
                             # "Started training worker group ...": Ray Train's, not the user's
                             logging_config=LoggingConfig("INFO" if verbose() else "WARNING"),
                             failure_config=FailureConfig(max_failures=WORKER_RESTARTS)))
    stop.clear(out_dir)  # a request of an earlier, stopped run is not this one's
    trainer.fit()
