"""The skew doctor from the command line.

    python -m workflows.doctor --data RUN_DIR/extract --draft DRAFT_DIR \\
        [--features FILE.safetensors] [--target TARGET_DIR] [--steps 3] [--json OUT.json]

Prints the verdict. Exit code 0: no fault found; 1: a fault (the findings say which and the
fix); 2: bad input (a missing directory, a file that is not what it should be).
The target defaults to the one the run's prepare stage recorded (RUN_DIR/prepare/target.json).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OK, FAULT, BAD_INPUT = 0, 1, 2


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m workflows.doctor", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="extraction directory (RUN_DIR/extract)")
    p.add_argument("--draft", required=True, help="draft directory (config.json + weights)")
    p.add_argument("--features", help="features an engine fed the draft (.safetensors: "
                   "hidden_states [T, n, H] or draft_inputs [T, n*H], optional token_ids [T])")
    p.add_argument("--target", help="target model directory (default: from RUN_DIR/prepare)")
    p.add_argument("--steps", type=int, default=3, help="draft positions evaluated")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="allowed shortfall against training's reported accuracy")
    p.add_argument("--json", help="also write the verdict as JSON here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    from safetensors import SafetensorError

    from eyas.evaluate.load import diagnose_run

    for flag in ("data", "draft", "target", "features"):
        path = getattr(args, flag)
        if path and not Path(path).exists():
            print(f"doctor: --{flag} {path}: no such file or directory", file=sys.stderr)
            return BAD_INPUT
    try:
        verdict = diagnose_run(args.data, args.draft, args.target, args.features,
                               steps=args.steps, tolerance=args.tolerance)
    except (OSError, ValueError, KeyError, SafetensorError) as e:  # unreadable or malformed
        print(f"doctor: cannot examine these inputs: {type(e).__name__}: {e}", file=sys.stderr)
        return BAD_INPUT
    print(verdict.explain())
    if args.json:
        Path(args.json).write_text(json.dumps(verdict.to_dict(), indent=1))
    return OK if verdict.ok else FAULT


if __name__ == "__main__":
    sys.exit(main())
