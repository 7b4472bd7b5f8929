"""Served acceptance against the standalone prediction, and the speedup, from one run:

  served tau (vLLM) / predicted tau (evaluate stage, standalone)   goal >= 0.95
  speculative / plain output tokens per second (same prompts, same engine)

    python bench/serve_bench.py RUN_DIR     # a run that went through evaluate and serve
    python bench/serve_bench.py RUN_DIR --rerun [serve overrides as key=value]

Without --rerun it reads RUN_DIR/evaluate/report.json and RUN_DIR/serve/report.json (both
measured by that run); with --rerun it serves the run's draft again first.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str]) -> None:
    run = Path(argv[0])
    if "--rerun" in argv:
        from dataclasses import replace

        from eyas.config import ServeConfig
        from eyas.serve.run import serve_run

        overrides = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
        cfg = replace(ServeConfig(), **{k: type(getattr(ServeConfig(), k))(v)
                                        for k, v in overrides.items()})
        target = json.loads((run / "prepare" / "target.json").read_text())["target_path"]
        serve_run(target, run / "train" / "draft", run / "extract", cfg, run / "serve")
    evaluate = json.loads((run / "evaluate" / "report.json").read_text())
    serve = json.loads((run / "serve" / "report.json").read_text())
    from eyas.draft.accuracy import predicted_tau

    k = serve["num_speculative_tokens"]  # compare at the k that was served
    conditional = evaluate["per_position_accuracy"]["heldout"]["conditional"]
    if len(conditional) < k:
        raise SystemExit(f"the evaluate stage scored {len(conditional)} positions; serving "
                         f"used k={k}: rerun evaluate with serve.num_speculative_tokens={k}")
    predicted = predicted_tau(conditional[:k])
    print(f"engine: {serve['engine_version']}, k={serve['num_speculative_tokens']}, "
          f"{serve['prompts']} held-out prompts; parity {serve['parity']}, "
          f"lossless {serve['lossless']}")
    print(f"tau at k={k}: predicted (standalone) {predicted:.3f}, served {serve['tau']:.3f}; "
          f"reference engine {evaluate['measured_tau']:.3f} (at eval.steps="
          f"{len(conditional)})")
    print(f"served tau / predicted tau = {serve['tau'] / predicted:.3f}  (goal >= 0.95)")
    print(f"speculative / plain tokens/s = {serve['speedup']:.3f}  "
          f"({serve['tokens_per_s_spec']:.0f} vs {serve['tokens_per_s_plain']:.0f})")


if __name__ == "__main__":
    main(sys.argv[1:])
