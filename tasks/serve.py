"""Ray adapter of the serve stage: parity, then the benchmark, in an actor of its own (the
vLLM engine runs in-process there and sets process-wide state: threads, seeds, GC)."""
from __future__ import annotations

import ray

from tasks import use_node_cores


@ray.remote(max_restarts=0)
class ServeActor:
    def run(self, target_dir: str, draft_dir: str, data_dir: str, cfg, out_dir: str,
            offline_dir: str | None = None) -> dict:
        from eyas.conventions.engines import engine_rules
        from eyas.serve.parity import ServeFault
        from eyas.serve.run import serve_run

        if not engine_rules(cfg.engine).boots_vllm:  # eyas's own torch code, in this actor
            use_node_cores()
        try:
            return serve_run(target_dir, draft_dir, data_dir, cfg, out_dir, offline_dir)
        except ServeFault as e:  # failed parity, or the served acceptance's alarm
            return {"fault": str(e)}
