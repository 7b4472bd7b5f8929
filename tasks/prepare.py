"""Ray adapter of the prepare stage: resolve (or build) the target, tokenize the conversations."""
from __future__ import annotations

import os
from dataclasses import asdict

import ray

from eyas.config import PipelineConfig


@ray.remote(max_retries=2)
def prepare_task(cfg: PipelineConfig, out_dir: str) -> dict:
    import torch

    from eyas.data.prepare import prepare
    from eyas.target import load_tokenizer, resolve_target

    # Ray pins workers to one thread; the stages run one at a time, so use the node's cores.
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    target = resolve_target(cfg.target)
    tokenizer = load_tokenizer(target.path)
    manifest = prepare(cfg.data, tokenizer, out_dir)
    return {"target_path": str(target.path), "identity": asdict(target.identity),
            "build_report": target.build_report, "manifest": manifest}
