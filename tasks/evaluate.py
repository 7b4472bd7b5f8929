"""Ray adapter of the evaluate stage: the report, or the doctor's verdict when it found a
fault, from an actor of its own (tasks.run_in_actor)."""
from __future__ import annotations

import ray

from tasks import use_node_cores


@ray.remote(max_restarts=0)
class EvaluateActor:
    def run(self, data_dir: str, draft_dir: str, target_dir: str, cfg, out_dir: str,
            steps: int, prompt_sets=()) -> dict:
        """The report, or {"alarm": the doctor's verdict} when it found a fault (prompt_sets:
        eyas.conversations.prompt_sets.PromptSet, each profiled beside the held-out split)."""
        from eyas.doctor.verdict import SkewAlarm
        from eyas.evaluate.run import evaluate_run

        use_node_cores()
        try:
            return evaluate_run(data_dir, draft_dir, target_dir, cfg, out_dir, steps,
                                prompt_sets)
        except SkewAlarm as alarm:
            return {"alarm": str(alarm)}
