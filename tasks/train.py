"""Ray adapter of the train stage: Ray Train's TorchTrainer runs eyas' training loop on
`train.num_workers` workers (process group over gloo on CPU, NCCL on GPU); rank 0 logs to the
stage's MLflow child run and writes checkpoints and the draft. Online (train.source=online),
the workers read a stream from target replicas (tasks/online.py) instead of stored shards."""
from __future__ import annotations

import os
from pathlib import Path

from eyas.config import DraftConfig, TrainConfig


def _loop(config: dict) -> None:
    import mlflow
    import ray.train
    import torch
    import torch.distributed as dist

    from eyas.train.loop import Worker, train_draft

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(config["threads"])))
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def all_reduce(t):
        if world > 1:
            t = t.to(device)
            dist.all_reduce(t)
        return t.cpu() if t.device.type != "cpu" else t

    log = None
    if rank == 0 and config.get("mlflow_run_id"):
        client = mlflow.MlflowClient(config["tracking_uri"])
        run_id = config["mlflow_run_id"]
        every = max(1, config["log_every"])

        def log(step, metrics):
            if step % every == 0:
                for k, v in metrics.items():
                    client.log_metric(run_id, k, float(v), step=step)

    data = config["data_dir"]
    if config.get("online"):
        from eyas.layout import HiddenStateLayout
        from tasks.online import streamed_data

        online = config["online"]
        data = streamed_data(online["feeder"], HiddenStateLayout.from_dict(online["layout"]),
                             online["prepare_dir"], online["num_samples"],
                             config["train"].batch_size)
    outcome = train_draft(data, config["target_dir"], config["out_dir"],
                          config["train"], config["draft"],
                          Worker(rank, world, all_reduce, device), log)
    ray.train.report({"steps": outcome.steps})


def run_training(data_dir: Path, target_dir: str, out_dir: Path, train: TrainConfig,
                 draft: DraftConfig, tracking_uri: str | None, mlflow_run_id: str | None,
                 use_gpu: bool = False, threads_per_worker: int | None = None,
                 online: dict | None = None) -> None:
    """`online`: {"feeder", "layout", "prepare_dir", "num_samples"} (tasks/online.py); the
    workers then take half the CPUs, the target replicas the other half."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    cpus = os.cpu_count() or 1
    if online and not use_gpu:
        cpus = max(1, cpus // 2)
    threads = threads_per_worker or max(1, cpus // train.num_workers)
    trainer = TorchTrainer(
        _loop,
        train_loop_config={"data_dir": str(data_dir), "target_dir": target_dir,
                           "out_dir": str(out_dir), "train": train, "draft": draft,
                           "tracking_uri": tracking_uri, "mlflow_run_id": mlflow_run_id,
                           "log_every": 5, "threads": threads, "online": online},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=train.num_workers, use_gpu=use_gpu,
                                     resources_per_worker=None if use_gpu else
                                     {"CPU": min(1, threads) if not online else
                                      min(1, cpus / train.num_workers)}),
        run_config=RunConfig(name="train", storage_path=str(out_dir / "ray")))
    trainer.fit()
