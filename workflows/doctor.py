"""The skew doctor from the command line.

    python -m workflows.doctor --data RUN_DIR/extract --draft DRAFT_DIR \\
        [--engine vllm|vllm:0.32|sglang:0.5.23] [--write-fixed DIR] \\
        [--features FILE.safetensors] [--target TARGET_DIR] [--steps 3] [--json OUT.json] \\
        [--reported-accuracy 0.62,0.55,0.50] [--debug]

Config only: with --target a directory holding just the target's config.json (or the file
itself) and no --data, the doctor reads the draft's config.json and its weights' headers and
says which layers vLLM's V1 runner (the CPU build), its V2 runner (a GPU's default) and SGLang
will feed it, against what the config says it was trained on: no tokenizer, no weights, any
draft family (EAGLE-3, EAGLE 3.1, DFlash, DSpark, Domino, P-EAGLE). --static forces it.

The draft may be eyas's, or any EAGLE-3 draft another tool wrote (vLLM/SGLang
LlamaForCausalLMEagle3 configs, SpecForge exports, speculators): --engine says which engine
and version will serve it; the doctor prints what that engine will feed the draft from its
config, and OK or FAULT with the exact ids to write (default for another tool's draft: vllm).
--write-fixed DIR writes the corrected config for that engine beside a copy of the weights.

Without --data (then --target is needed) the doctor builds its own small probe: the target's
greedy answers to a few prompts (built-in, or --prompts FILE, one per line) through its chat
template, every layer's output stored (CPU; a few prompts of a small target take seconds).

Prints the verdict. Exit code 0: OK, the evidence decides and finds no fault; 1: a fault (the
findings say which and the fix); 2: bad input (a missing directory, a file that is not what it
should be); 3: INCONCLUSIVE, the evidence is within its noise (the verdict says what would
settle it: more probe samples, or the engine's features). Errors print as
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

from eyas.conventions.rules import TRAINER_ID_SHIFT
from eyas.run_records import RunDir

OK, FAULT, BAD_INPUT, INCONCLUSIVE = 0, 1, 2, 3
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
    p.add_argument("--data", help="extraction directory (RUN_DIR/extract); without it the "
                   "doctor builds a probe from prompts (needs --target)")
    p.add_argument("--prompts", help="without --data: a text file, one user prompt per line "
                   "(default: a few built-in ones)")
    p.add_argument("--probe-dir", help="without --data: where the probe is built and kept "
                   "(default: a temporary directory, removed afterwards)")
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
    p.add_argument("--json", help="also write the verdict as JSON here (- for stdout, then the "
                   "only thing printed there)")
    p.add_argument("--static", action="store_true", help="config only, even where --target "
                   "has weights: what each engine and runner feeds, from the configs")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="config only: where vLLM will serve the draft, so which of its runners "
                   "is held to the config (cpu: V1; cuda: V2, V1 with parallel drafting); "
                   "default: both")
    p.add_argument("--trainer", choices=tuple(TRAINER_ID_SHIFT),
                   help="config only: the tool that wrote the draft, where its ids' convention "
                   "depends on it (ids only under eagle_config)")
    p.add_argument("--debug", action="store_true", help="print tracebacks of errors")
    args = p.parse_args(argv)
    if args.static and not args.target:
        p.error("--static needs --target (a directory with the target's config.json, or it)")
    if not args.data and not args.target:
        p.error("give --data RUN_DIR/extract, or --target TARGET_DIR for the doctor to build "
                "its own probe through the target")
    return args


def _say(message: str) -> None:
    print("eyas: " + " ".join(str(message).split()), file=sys.stderr)  # one paragraph


def _refuse(args, message: str, code: int) -> int:
    """A refusal: the eyas: paragraph on stderr, and with --json - the same as JSON on
    standard output (a caller parsing it gets an answer, not an empty stream)."""
    _say(message)
    if getattr(args, "json", None) == "-":
        print(json.dumps({"status": {BAD_INPUT: "BAD_INPUT", FAULT: "ERROR"}.get(code, code),
                          "exit_code": code, "error": " ".join(str(message).split())},
                         indent=1))
    return code


def main(argv=None) -> int:
    args = parse(argv)
    from safetensors import SafetensorError

    from eyas.doctor.gap import ReportedAccuracy
    from eyas.doctor.run import diagnose_run

    for flag in ("data", "draft", "target", "features", "prompts"):
        path = getattr(args, flag)
        if path and not Path(path).exists():
            from eyas.files import why_absent
            return _refuse(args, f"--{flag} {path}: {why_absent(path)}", BAD_INPUT)
    if args.static or (not args.data and _config_only(Path(args.target))):
        return _static(args)
    import tempfile
    scratch = None
    try:
        own_probe = not args.data
        if own_probe:
            scratch = None if args.probe_dir else tempfile.TemporaryDirectory(prefix="eyas-probe-")
            args.data = str(build_probe(args.draft, args.target, args.engine or "vllm",
                                        _prompts(args.prompts),
                                        Path(args.probe_dir or scratch.name)))
            if args.reported_accuracy:
                _say("--reported-accuracy ignored without --data: the probe is not the "
                     "draft's training data")
                args.reported_accuracy = None
        verdict = diagnose_run(args.data, args.draft, args.target, args.features,
                               steps=args.steps, tolerance=args.tolerance,
                               reported=args.reported_accuracy and ReportedAccuracy.given(
                                   args.reported_accuracy, "given with --reported-accuracy"),
                               engine=args.engine or ("vllm" if args.write_fixed else None),
                               training_data=not own_probe)
    except (OSError, ValueError, KeyError, SafetensorError) as e:  # unreadable or malformed
        if args.debug:
            traceback.print_exc()
        return _refuse(args, f"cannot examine these inputs: "
                       f"{e if isinstance(e, (OSError, ValueError)) else f'{type(e).__name__}: {e}'}",
                       BAD_INPUT)
    except Exception as e:
        if args.debug:
            raise
        return _refuse(args, f"the doctor failed: {type(e).__name__}: {e} (a bug in eyas, or "
                       "an input it does not check yet; rerun with --debug for the traceback)",
                       FAULT)
    finally:
        if scratch is not None:
            scratch.cleanup()
    print(verdict.explain())
    if args.write_fixed:
        code = _write_fixed(args, verdict)
        if code:
            return code
    if args.json == "-":
        print(json.dumps(verdict.to_dict(), indent=1), file=sys.stderr)
    elif args.json:
        Path(args.json).write_text(json.dumps(verdict.to_dict(), indent=1))
    return OK if verdict.ok else FAULT if verdict.findings else INCONCLUSIVE


def _config_only(target: Path) -> bool:
    """A target given as its config.json alone (no weights beside it)."""
    return target.is_file() or not any(target.glob("*.safetensors")) and not any(
        target.glob("*.bin"))


def _static(args) -> int:
    """The config-only verdict (eyas/doctor/static.py)."""
    from eyas.doctor.static import examine
    from eyas.layout import LayoutError
    from eyas.targets import TargetError

    try:
        engine = (args.engine or "vllm").split(":")[0].lower()
        verdict = examine(args.draft, args.target, args.trainer, engine, args.device)
    except (OSError, ValueError, KeyError, TargetError, LayoutError) as e:
        if args.debug:
            traceback.print_exc()
        return _refuse(args, f"cannot read these configs: {e}", BAD_INPUT)
    text = json.dumps(verdict.to_dict(), indent=1)
    if args.json == "-":
        print(text)
    else:
        print(verdict.explain())
        if args.json:
            Path(args.json).write_text(text)
    return OK if verdict.ok else FAULT if verdict.findings else INCONCLUSIVE


BUILTIN_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences why the sky is blue.",
    "List five uses of a paperclip.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Summarise the rules of chess for a beginner.",
    "What is the difference between a list and a tuple in Python?",
    "Write a short poem about autumn.",
    "How do I make a cup of tea?",
)


def _prompts(path) -> list[str]:
    if not path:
        return list(BUILTIN_PROMPTS)
    lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"--prompts {path}: no prompts (one per line)")
    return lines


def build_probe(draft_dir, target_dir, engine: str, prompts: list[str], out: Path,
                max_new_tokens: int = 48) -> Path:
    """An extraction of the target for the doctor: its greedy answers to `prompts` through
    its chat template, the probe split with every layer's output. The stored slots are the
    layout the doctor tests first (what the draft's config says, else what the engine feeds),
    so the data's layout and the draft's agree by construction. Returns OUT/extract."""
    import torch
    from transformers import AutoModelForCausalLM

    from eyas.config import DataConfig, ExtractConfig
    from eyas.conversations.prepare import prepare
    from eyas.conventions.engines import parse_engine
    from eyas.doctor.engine import claims_feed
    from eyas.draft.load import read_claims
    from eyas.doctor.run import hypothesis
    from eyas.extract import (Extraction, blocks_forward, extract_dataset, in_process_executor,
                              local_blocks)
    from eyas.files import atomic_write
    from eyas.targets import identify, load_tokenizer
    from eyas.run_records import TargetRecord, write_target

    tokenizer = load_tokenizer(target_dir)
    target = identify(target_dir, tokenizer)
    claims = read_claims(draft_dir, target)
    name, version = parse_engine(engine)
    layout, _ = hypothesis(claims, claims_feed(claims, target, name, version), None)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    conversations = []
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            out_ids = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
        answer = tokenizer.decode(out_ids[0, ids.shape[1]:], skip_special_tokens=True)
        conversations.append(messages + [{"role": "assistant", "content": answer}])
    out.mkdir(parents=True, exist_ok=True)
    answers = out / "probe_conversations.jsonl"  # both splits: the probe is all the doctor reads
    atomic_write(answers, "".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    run = RunDir.of(out)
    prepare(DataConfig(train_files=[str(answers)], heldout_files=[str(answers)],
                       max_length=2048), tokenizer, run.prepare,
            show_progress=False)  # the prepare stage's writer: the manifest is its own
    write_target(out, TargetRecord(str(target_dir)))
    cfg = ExtractConfig(dtype="float32", samples_per_shard=8, batch_tokens=4096,
                        probe_samples=len(prompts))
    forward = blocks_forward(local_blocks(str(target_dir), target.num_layers, cfg, "float32"))
    executor = in_process_executor(forward, layout, run.extract, cfg, tokenizer.pad_token_id or 0)
    extract_dataset(Extraction(run.prepare, run.extract, layout, tokenizer, cfg, "float32"),
                    executor, forward)
    return run.extract


def _write_fixed(args, verdict) -> int:
    """The corrected config, when the engine check established what to write."""
    from eyas.draft import fixed

    check = verdict.engine
    if check is None or check.write is None:
        _say(f"--write-fixed {args.write_fixed}: nothing written: no id list makes the engine "
             "feed the slots the draft was trained on (see the verdict above)")
        return BAD_INPUT
    out = fixed.write_fixed(args.draft, args.write_fixed, check.claims, check.trained,
                            check.engine, check.version)
    print(f"wrote {out}/config.json for {check.fed.label} ({check.how}): serve {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
