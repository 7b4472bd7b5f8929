"""Ray adapters of the evaluate and serve stages: each runs in its own actor process (the
vLLM engine runs in-process there and sets process-wide state: threads, seeds, GC)."""
from __future__ import annotations

import ray

from tasks import use_node_cores


@ray.remote(max_restarts=0)
class EvaluateActor:
    def run(self, data_dir: str, draft_dir: str, target_dir: str, cfg, out_dir: str) -> dict:
        """The report, or {"alarm": the doctor's verdict} when it found a fault."""
        from eyas.evaluate.gap import SkewAlarm
        from eyas.evaluate.run import evaluate_run

        use_node_cores()
        try:
            return evaluate_run(data_dir, draft_dir, target_dir, cfg, out_dir)
        except SkewAlarm as alarm:
            return {"alarm": str(alarm)}


@ray.remote(max_restarts=0)
class ServeActor:
    def run(self, target_dir: str, draft_dir: str, data_dir: str, cfg, out_dir: str) -> dict:
        from eyas.serve.run import ParityError, serve_run

        if cfg.engine == "reference":
            use_node_cores()
        try:
            return serve_run(target_dir, draft_dir, data_dir, cfg, out_dir)
        except ParityError as e:
            return {"parity_error": str(e)}


def run_in_actor(actor_class, *args, num_cpus: float = 1) -> dict:
    actor = actor_class.options(num_cpus=num_cpus).remote()
    try:
        return ray.get(actor.run.remote(*args))
    finally:
        ray.kill(actor)
