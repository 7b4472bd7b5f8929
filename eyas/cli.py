"""The `eyas` command (pyproject's console script): the pipeline and its tools behind one name.

    eyas run [GROUP=CHOICE ...] [key=value ...]   the pipeline         python -m workflows.pipeline
    eyas doctor draft=DIR data=RUN_DIR/extract     the skew doctor      python -m workflows.doctor
    eyas export draft=DIR target=DIR out=DIR       vLLM/SGLang export   python -m workflows.export
    eyas replay run_dir=DIR [tracking_uri=URI]     MLflow calls kept    python -m workflows.replay
    eyas bench NAME [ARGS ...]                     bench/NAME_bench.py  python bench/NAME_bench.py

Every command takes key=value (the tools' `--key value` works too) and `--help`; `--debug`
(or debug=true) shows tracebacks and the engines' own logs.

The commands run the checkout this file lives in: `pip install -e .` installs only the `eyas`
package (no top-level `workflows` or `tasks`, names other packages own, llama-index-workflows
among them), and the checkout's `workflows/`, `tasks/`, `conf/` and `bench/` are found from
here, put first on this process's path and on the PYTHONPATH its Ray workers inherit. They are
imported only when a command runs: eyas/ itself never imports them (tests/unit/test_layering.py).
"""
from __future__ import annotations

import ast
import importlib
import os
import re
import runpy
import sys
import textwrap
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
# name: (module in the checkout, what it does, arguments it takes by position)
COMMANDS = {
    "run": ("workflows.pipeline", "the pipeline: prepare, extract, train, evaluate, serve", ()),
    "doctor": ("workflows.doctor", "the skew doctor: which tensors a draft was trained on, and "
               "is fed", ()),
    "export": ("workflows.export", "a draft for vLLM and SGLang, and their launch commands", ()),
    "compare": ("workflows.compare", "several drafts and the target alone served side by side "
                "on the same prompt sets", ()),
    "replay": ("workflows.replay", "send the MLflow calls a run kept while its store was away",
               ("run_dir", "tracking_uri")),
    "bench": (None, "a benchmark in bench/: ratios measured side by side in one run", ()),
}
_KEY = re.compile(r"[a-z][a-z0-9_-]*")


def usage() -> str:
    lines = [f"  {name:<8}{what}" for name, (_, what, _) in COMMANDS.items()]
    return "\n".join([
        "usage: eyas COMMAND [key=value ...] [--debug]", "", "commands:", *lines, "",
        "eyas COMMAND --help says what each takes; e.g.",
        "  eyas run run_dir=runs/demo",
        "  eyas doctor data=runs/demo/extract draft=runs/demo/train/draft",
        "  eyas compare run_dir=runs/demo draft.theirs=DIR serve.prompt_sets.chat=chats.jsonl",
        "  eyas bench serve runs/demo"])


def as_flags(args: list[str], positional: tuple[str, ...] = ()) -> list[str]:
    """key=value as the argparse tools take it: `write_fixed=DIR` -> `--write-fixed=DIR`,
    a switch `static=true` -> `--static` (`=false`: left out), a key in `positional` -> its
    value, in that order. Anything else (`--data DIR`, a value) passes as it is."""
    flags, given = [], {}
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or not _KEY.fullmatch(key):
            flags.append(arg)
        elif key.replace("-", "_") in positional:
            given[key.replace("-", "_")] = value
        elif key == "debug" or value.lower() in ("true", "false"):
            on = value.lower() in ("true", "1", "yes")
            flags += [f"--{key.replace('_', '-')}"] if on else []
        else:
            flags.append(f"--{key.replace('_', '-')}={value}")
    return [given[k] for k in positional if k in given] + flags


def benches() -> dict[str, Path]:
    """bench/NAME_bench.py (and the other scripts there) by the name `eyas bench` takes:
    cpu_size_bench.py -> cpu-size, doctor_verdicts.py -> doctor-verdicts."""
    scripts = sorted((CHECKOUT / "bench").glob("*.py"))
    return {p.stem.removesuffix("_bench").replace("_", "-"): p for p in scripts
            if "__main__" in p.read_text()}  # helper modules (peer_recipe.py) are not run


def _bench_help(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or path.name


def _bench(args: list[str]) -> int:
    scripts = benches()
    if not args or args[0] in ("-h", "--help"):
        width = max(map(len, scripts))
        print("usage: eyas bench NAME [ARGS ...]   (the script's own arguments: eyas bench "
              "NAME --help)\n\nbenchmarks:")
        for name, path in scripts.items():
            first = " ".join(_bench_help(path).split("\n\n")[0].split())
            print(f"  {name:<{width}}  {textwrap.shorten(first, 96 - width)}")
        return 0 if args else 2
    name, rest = args[0].replace("_", "-").removesuffix("-bench"), args[1:]
    if name not in scripts:
        return _say(f"no benchmark {args[0]!r}; there are: {', '.join(scripts)}")
    if {"-h", "--help"} & set(rest):
        print(f"eyas bench {name}: {scripts[name]}\n\n{_bench_help(scripts[name])}")
        return 0
    sys.argv = [str(scripts[name]), *rest]
    try:
        runpy.run_path(str(scripts[name]), run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):  # a bench's refusal: say it, as python would have
            print(e.code, file=sys.stderr)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _say(message: str, code: int = 2) -> int:
    print(f"eyas: {message}", file=sys.stderr)
    return code


def _use_checkout() -> bool:
    if not (CHECKOUT / "workflows" / "pipeline.py").is_file():
        return False
    root = str(CHECKOUT)
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        return _say(f"no command {command!r}; eyas --help lists them "
                    f"({', '.join(COMMANDS)})")
    if not _use_checkout():
        return _say(f"`eyas {command}` runs from a checkout of eyas's repository (its "
                    f"workflows/, tasks/ and conf/ are not installed; {CHECKOUT} has none): "
                    "clone it and `pip install -e .` there")
    if command == "bench":
        return _bench(rest)
    module_name, _, positional = COMMANDS[command]
    if command == "run" and {"-h", "--help"} & set(rest):  # without importing Ray (seconds)
        print(importlib.import_module("workflows.config").usage("eyas run"))
        return 0
    module = importlib.import_module(module_name)
    module.PROG = f"eyas {command}"  # what its usage and messages call it
    if command in ("run", "compare"):  # key=value as they are
        return module.main(rest)
    try:
        return module.main(as_flags(rest, positional))
    finally:
        if {"-h", "--help"} & set(rest):
            print("\nEach argument may be written key=value: " + (
                " ".join(f"{k}={k.upper()}" for k in positional) if positional else
                "draft=DIR for --draft DIR, write_fixed=DIR for --write-fixed DIR"))


if __name__ == "__main__":
    sys.exit(main())
