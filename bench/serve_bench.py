"""Served acceptance against the standalone prediction, and latency with and without the
draft, from one run:

  served tau (vLLM) / predicted tau (evaluate stage, standalone)   goal >= 0.95
  speculative / plain time per output token at concurrency 1 (same prompts, same engine),
  and the sweep over serve.concurrency: per level tau, tokens/s, the ratio, losslessness

    python bench/serve_bench.py RUN_DIR     # a run that went through evaluate and serve
    python bench/serve_bench.py RUN_DIR --rerun [serve overrides as key=value]

Without --rerun it reads RUN_DIR/evaluate/report.json and RUN_DIR/serve/report.json (both
measured by that run); with --rerun it serves the run's draft again first.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str]) -> None:
    run = Path(argv[0])
    if "--rerun" in argv:
        from dataclasses import replace

        from eyas.config import ServeConfig
        from eyas.serve.run import serve_run

        overrides = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
        def parse(key, text):
            default = getattr(ServeConfig(), key)
            if isinstance(default, list):  # concurrency=1,4,16
                return [int(v) for v in text.strip("[]").split(",") if v.strip()]
            return type(default)(text)
        cfg = replace(ServeConfig(), **{k: parse(k, v) for k, v in overrides.items()})
        from eyas.run_records import target_path
        target = target_path(run)
        serve_run(target, RunDir.of(run).draft, RunDir.of(run).extract, cfg, RunDir.of(run).serve)
    evaluate = json.loads((RunDir.of(run).evaluate / "report.json").read_text())
    serve = json.loads((RunDir.of(run).serve / "report.json").read_text())
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
          f"reference engine {evaluate['measured_tau']:.3f} (at evaluate's k="
          f"{len(conditional)})")
    print(f"served tau / predicted tau = {serve['tau'] / predicted:.3f}  (goal >= 0.95)")
    print(f"concurrency 1: speculative / plain time per token = {serve['latency_ratio']:.3f}  "
          f"({serve['time_per_token_ms_spec']:.2f} vs {serve['time_per_token_ms_plain']:.2f} "
          "ms per output token)")
    print(f"{'concurrency':>11} {'tau':>6} {'spec tok/s':>10} {'plain tok/s':>11} "
          f"{'spec/plain time per token':>26} {'lossless':>8}")
    for p in serve["sweep"]:
        print(f"{p['concurrency']:>11} {p['tau']:>6.3f} {p['tokens_per_s_spec']:>10.0f} "
              f"{p['tokens_per_s_plain']:>11.0f} {p['ratio']:>26.3f} {str(p['lossless']):>8}")


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]) or not sys.argv[1:]:  # usage: the docstring
        print(__doc__)
        sys.exit(0 if sys.argv[1:] else 2)
    main(sys.argv[1:])
