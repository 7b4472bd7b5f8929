"""The skew doctor from the command line.

    python -m workflows.doctor --data RUN_DIR/extract --draft DRAFT_DIR \\
        [--engine vllm|vllm:0.32|sglang:0.5.23] [--write-fixed DIR] \\
        [--features FILE.safetensors] [--target TARGET_DIR] [--steps 3] [--json OUT.json] \\
        [--reported-accuracy 0.62,0.55,0.50] [--debug]

The draft may be eyas's, or any EAGLE-3 draft another tool wrote (vLLM/SGLang
LlamaForCausalLMEagle3 configs, SpecForge exports, speculators): --engine says which engine
and version will serve it; the doctor prints what that engine will feed the draft from its
config, and OK or FAULT with the exact ids to write (default for another tool's draft: vllm).
--write-fixed DIR writes the corrected config for that engine beside a copy of the weights.

Prints the verdict. Exit code 0: no fault found; 1: a fault (the findings say which and the
fix); 2: bad input (a missing directory, a file that is not what it should be). Errors print as
one paragraph starting `eyas: ` on stderr; --debug adds the traceback.
The target defaults to the one the run's prepare stage recorded (RUN_DIR/prepare/target.json).
The training gap holds the draft to what its trainer measured while training (eyas drafts
record it); for a draft from another trainer give that figure with --reported-accuracy.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

OK, FAULT, BAD_INPUT = 0, 1, 2
PROG = "python -m workflows.doctor"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage dump -> one eyas: paragraph, same exit code
        _say(f"{message} (see {PROG} --help)")
        raise SystemExit(BAD_INPUT)


def _accuracies(text: str) -> list[float]:
    """'0.62,0.55,0.50' -> [0.62, 0.55, 0.5]: in-vocab accuracy per draft position."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected the in-vocab accuracy per draft position as fractions in "
            "[0, 1], comma-separated, e.g. 0.62,0.55,0.50")
    return values


def parse(argv):
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="extraction directory (RUN_DIR/extract)")
    p.add_argument("--draft", required=True, help="draft directory (config.json + weights)")
    p.add_argument("--features", help="features an engine fed the draft (.safetensors: "
                   "hidden_states [T, n, H] or draft_inputs [T, n*H], optional token_ids [T])")
    p.add_argument("--target", help="target model directory (default: from RUN_DIR/prepare)")
    p.add_argument("--steps", type=int, default=3, help="draft positions evaluated")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="allowed shortfall against training's reported accuracy")
    p.add_argument("--reported-accuracy", type=_accuracies, metavar="A0,A1,...",
                   help="what training measured on its training data, in-vocab accuracy per "
                   "draft position (default: what the draft's config records)")
    p.add_argument("--engine", metavar="ENGINE[:VERSION]",
                   help="the engine that will serve the draft: vllm, vllm:0.32, sglang:0.5.23")
    p.add_argument("--write-fixed", metavar="DIR",
                   help="write a config that makes --engine feed the slots the draft was "
                   "trained on, beside a copy of its weights (originals untouched)")
    p.add_argument("--json", help="also write the verdict as JSON here")
    p.add_argument("--debug", action="store_true", help="print tracebacks of errors")
    return p.parse_args(argv)


def _say(message: str) -> None:
    print("eyas: " + " ".join(str(message).split()), file=sys.stderr)  # one paragraph


def main(argv=None) -> int:
    args = parse(argv)
    from safetensors import SafetensorError

    from eyas.evaluate.gap import ReportedAccuracy
    from eyas.evaluate.load import diagnose_run

    for flag in ("data", "draft", "target", "features"):
        path = getattr(args, flag)
        if path and not Path(path).exists():
            _say(f"--{flag} {path}: no such file or directory")
            return BAD_INPUT
    try:
        verdict = diagnose_run(args.data, args.draft, args.target, args.features,
                               steps=args.steps, tolerance=args.tolerance,
                               reported=args.reported_accuracy and ReportedAccuracy.given(
                                   args.reported_accuracy, "given with --reported-accuracy"),
                               engine=args.engine or ("vllm" if args.write_fixed else None))
    except (OSError, ValueError, KeyError, SafetensorError) as e:  # unreadable or malformed
        if args.debug:
            traceback.print_exc()
        _say(f"cannot examine these inputs: "
             f"{e if isinstance(e, (OSError, ValueError)) else f'{type(e).__name__}: {e}'}")
        return BAD_INPUT
    except Exception as e:
        if args.debug:
            raise
        _say(f"the doctor failed: {type(e).__name__}: {e} (a bug in eyas, or an input it "
             "does not check yet; rerun with --debug for the traceback)")
        return FAULT
    print(verdict.explain())
    if args.write_fixed:
        code = _write_fixed(args, verdict)
        if code:
            return code
    if args.json:
        Path(args.json).write_text(json.dumps(verdict.to_dict(), indent=1))
    return OK if verdict.ok else FAULT


def _write_fixed(args, verdict) -> int:
    """The corrected config, when the engine check established what to write."""
    from eyas.draft import formats
    from eyas.draft.formats.feed import parse_engine

    fix = (verdict.engine or {}).get("write")
    if fix is None:
        _say(f"--write-fixed {args.write_fixed}: nothing written: no id list makes the engine "
             "feed the slots the draft was trained on (see the verdict above)")
        return BAD_INPUT
    engine, version = parse_engine(verdict.engine["engine"].replace(" ", ":").lower())
    out = formats.write_fixed(args.draft, args.write_fixed, verdict.claims,
                              verdict.engine_trained, engine, version)
    print(f"wrote {out}/config.json for {verdict.engine['engine']} ({verdict.engine['how']}): "
          f"serve {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
