"""Ray adapter of the prepare stage: resolve (or build) the target, tokenize the conversations."""
from __future__ import annotations

from dataclasses import asdict

import ray

from eyas.config import PipelineConfig
from tasks import use_node_cores


@ray.remote(max_retries=2)
def prepare_task(cfg: PipelineConfig, out_dir: str) -> dict:
    from eyas.data.prepare import prepare
    from eyas.target import load_tokenizer, resolve_target

    use_node_cores()  # the stages run one at a time
    target = resolve_target(cfg.target)
    tokenizer = load_tokenizer(target.path)
    manifest = prepare(cfg.data, tokenizer, out_dir)
    return {"target_path": str(target.path), "identity": asdict(target.identity),
            "build_report": target.build_report, "manifest": manifest}
