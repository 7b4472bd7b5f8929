"""A command the docs give, timed as a user runs it: by default the README's pipeline command
(its `eyas run` arguments, read from the README itself), or `--block PAGE:NAME`, the commands
in the page's block marked `<!-- NAME -->` (the demo's: docs/benchmarks.md:demo-command), each
setup line (`python SCRIPT ...`) run first; into a fresh folder, a fresh run directory and an
empty target cache (the packaged model is converted again), as child processes of this one.

  recorded: minutes in all and per stage, served tau with its 95 % interval on the held-out
  split and each prompt set (drafts, acceptance per position, the evaluate stage's offline tau),
  at each concurrency the ratio with its interval (and whether it was interleaved), time per
  token with and without the draft (mean and p99) and time to first token, lossless, parity,
  the exit status

    python bench/first_command_bench.py --json docs/records/first_command.json
    python bench/first_command_bench.py --env ONEDNN_MAX_CPU_ISA=AVX2 --json out.json
    python bench/first_command_bench.py --also ONEDNN_MAX_CPU_ISA=AVX2 --json both.json
    python bench/first_command_bench.py --block docs/benchmarks.md:demo-command --json demo.json
    python bench/first_command_bench.py --block docs/recipe.md:latency-command \
        --vary data.regenerate=false --vary experiment=deep --json latency.json

`--env` emulates another CPU (ONEDNN_MAX_CPU_ISA=AVX2: a CPU without bfloat16 instructions,
where eyas's auto dtype picks float32); `--also ENV` times the command again in that
environment, one after the other, each run a row of the one record; `--vary ARGS` runs the
command again with these `eyas run` arguments added (a variant of the run, each from nothing
too, one row each). The README's "about N
minutes" is checked against the record by tests/unit/test_docs.py.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT / "bench"))
STAGES = ("prepare", "extract", "train", "evaluate", "serve")


def readme_arguments(readme: Path = CHECKOUT / "README.md") -> list[str]:
    """The `eyas run` arguments of the README's pipeline command."""
    block = re.search(r"<!-- pipeline-command -->\n```bash\n(.+)\n```", readme.read_text())
    if not block:
        raise SystemExit(f"{readme}: no pipeline-command block")
    command = block.group(1).rsplit("eyas run", 1)
    if len(command) != 2:
        raise SystemExit(f"{readme}: the pipeline command does not end in `eyas run ...`")
    return shlex.split(command[1])


def block_commands(page: Path, name: str) -> tuple[list[list[str]], list[str]]:
    """The setup commands (`python SCRIPT ...`, each as its words) and the `eyas run` arguments
    of the bash block marked `<!-- name -->` in `page`; a line ending in `\\` goes on."""
    block = re.search(rf"<!-- {re.escape(name)} -->\n```bash\n(.+?)\n```", page.read_text(), re.S)
    if not block:
        raise SystemExit(f"{page}: no `<!-- {name} -->` bash block")
    lines = [shlex.split(line) for line in block.group(1).replace("\\\n", " ").splitlines()]
    if not lines or lines[-1][:2] != ["eyas", "run"]:
        raise SystemExit(f"{page}: the {name} block does not end in `eyas run ...`")
    setup = lines[:-1]
    for words in setup:
        if words[:1] != ["python"]:
            raise SystemExit(f"{page}: the {name} block's setup line {' '.join(words)!r} is "
                             "not `python SCRIPT ...`")
    return setup, lines[-1][2:]


def _absolute(args: list[str], base: Path) -> list[str]:
    """KEY=PATH arguments naming a file the setup wrote in `base`, made absolute (the stages
    run in other working directories)."""
    out = []
    for arg in args:
        key, eq, value = arg.partition("=")
        out.append(f"{key}={base / value}" if eq and value and not value.startswith("/")
                   and (base / value).exists() else arg)
    return out


def _finished(run: Path, stage: str) -> float | None:
    marker = run / stage / "_COMPLETE.json"
    if not marker.exists():
        return None
    return time.mktime(time.strptime(json.loads(marker.read_text())["finished_at"],
                                     "%Y-%m-%d %H:%M:%S"))


def outcome(run: Path, started: float, ended: float, rc: int) -> dict:
    """What the run left: minutes per stage (from each stage's completion marker), served
    figures from serve/report.json."""
    out = {"rc": rc, "minutes": (ended - started) / 60, "stage_minutes": {}}
    last = started
    for stage in STAGES:
        done = _finished(run, stage)
        if done is not None:
            out["stage_minutes"][stage] = max(0.0, done - last) / 60
            last = done
    report = run / "serve" / "report.json"
    if report.exists():
        serve = json.loads(report.read_text())
        one = (serve.get("sweep") or [{}])[0]
        out.update(parity=serve.get("parity"), lossless=serve.get("lossless"),
                   tau=serve.get("tau"),
                   tau_interval=(serve.get("acceptance") or {}).get("tau_interval"),
                   ratio=one.get("ratio"), ratio_interval=one.get("ratio_interval"),
                   interleaved=one.get("interleaved"),
                   sets={s["name"]: served_set(run, s) for s in serve.get("prompt_sets", [])})
    manifest = run / "prepare" / "manifest.json"
    if manifest.exists():
        splits = json.loads(manifest.read_text()).get("splits", {})
        out["samples"] = {name: s.get("samples") for name, s in splits.items()}
    return out


def served_set(run: Path, served: dict) -> dict:
    """One prompt set's served figures (serve/report.json's prompt_sets entry), each
    concurrency level's among them, beside the evaluate stage's offline tau of the same set."""
    name, acceptance = served["name"], served["acceptance"]
    profile = run / "evaluate" / ("speculation_profile.json" if name == "heldout"
                                  else f"speculation_profile.{name}.json")
    offline = json.loads(profile.read_text()).get("mean_accept_length") \
        if profile.exists() else None
    levels = [{"concurrency": p["concurrency"], "requests": p.get("requests"),
               "ratio": p["ratio"], "ratio_interval": p.get("ratio_interval"),
               "interleaved": p.get("interleaved"), "lossless": p.get("lossless"),
               "tpot_ms": p["time_per_token_ms_spec"],
               "tpot_ms_plain": p["time_per_token_ms_plain"],
               "p99_tpot_ms": (p.get("with_draft") or {}).get("p99_tpot_ms"),
               "p99_tpot_ms_plain": (p.get("without_draft") or {}).get("p99_tpot_ms"),
               "ttft_ms": (p.get("with_draft") or {}).get("mean_ttft_ms"),
               "ttft_ms_plain": (p.get("without_draft") or {}).get("mean_ttft_ms")}
              for p in served["sweep"]]
    return {"tau": served["sweep"][0]["tau"], "tau_interval": acceptance.get("tau_interval"),
            "drafts": acceptance.get("drafts"), "per_position": acceptance.get("per_position_rate"),
            "offline_tau": offline, "ratio": levels[0]["ratio"],
            "ratio_interval": levels[0]["ratio_interval"], "levels": levels}


def main(argv: list[str]) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--block", metavar="PAGE:NAME",
                   help="time the commands of this docs block instead of the README's pipeline "
                        "command (e.g. docs/benchmarks.md:demo-command)")
    p.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                   help="environment of the run (e.g. ONEDNN_MAX_CPU_ISA=AVX2)")
    p.add_argument("--also", nargs="+", action="append", default=[], metavar="NAME=VALUE",
                   help="run it once more in this environment, after the first (repeatable): "
                        "each run one row of the same record")
    p.add_argument("--vary", nargs="+", action="append", default=[], metavar="KEY=VALUE",
                   help="run it once more with these `eyas run` arguments added, after the "
                        "others (repeatable): each variant one row of the same record")
    p.add_argument("--keep", type=Path, help="run here (kept) instead of a temporary folder")
    p.add_argument("--json", type=Path, help="also write the record here")
    a = p.parse_args(argv)
    if a.block:
        page, _, name = a.block.rpartition(":")
        setup, args = block_commands(CHECKOUT / page, name)
        what = f"{page}'s {name} block"
    else:
        setup, args, what = [], readme_arguments(), "the README's pipeline command"
    args = [x for x in args if not x.startswith("run_dir=")]
    results = []
    with tempfile.TemporaryDirectory(prefix="eyas-first-") as tmp:
        top = a.keep.resolve() if a.keep else Path(tmp)
        runs = [(a.env, []), *[(e, []) for e in a.also], *[(a.env, v) for v in a.vary]]
        for i, (extra, added) in enumerate(runs):
            # each run from nothing: its own folder, run directory and empty target cache
            results.append(timed(setup, args + added, top / f"run{i + 1}" if i else top,
                                 dict(e.split("=", 1) for e in extra)))
    print(json.dumps(results, indent=1))
    if a.json:
        from record import provenance, write
        write(a.json, results, provenance(argv),
              {_side(what, r, args): {"arguments": r["arguments"], "setup": r["setup"],
                                      "env": r["env"]} for r in results},
              shared=())  # the same command timed, no comparison of settings
    return results


def _side(what: str, row: dict, args: list[str]) -> str:
    added = row["arguments"][len(args):]
    return f"{what}, {_where(row['env'])}" + (f", with {' '.join(added)}" if added else "")


def _where(env: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in env.items()) or "this CPU as it is"


def timed(setup: list[list[str]], args: list[str], base: Path, extra: dict) -> dict:
    """The setup lines, then the `eyas run` arguments as a child process, in `base` (a fresh
    run directory and an empty target cache there) under this environment plus `extra`."""
    env = dict(os.environ, **extra)
    # this checkout's eyas, whichever one the environment installed
    env["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [env.get("PYTHONPATH")])])
    base.mkdir(parents=True, exist_ok=True)
    for words in setup:  # a script of the checkout's, run where the user stands
        script = CHECKOUT / words[1]
        subprocess.run([sys.executable, str(script if script.exists() else words[1]),
                        *words[2:]], cwd=base, env=env, check=True)
    run, cache = base / "run", base / "targets"  # an empty target cache
    command = [sys.executable, "-m", "workflows.pipeline", *_absolute(args, base),
               f"run_dir={run}", f"target.builtin.cache_dir={cache}"]
    print(f"running ({_where(extra)}):", " ".join(command), flush=True)
    started = time.time()
    rc = subprocess.run(command, cwd=base, env=env).returncode
    return {"arguments": args, "setup": [" ".join(w) for w in setup], "env": extra,
            **outcome(run, started, time.time(), rc)}


if __name__ == "__main__":
    main(sys.argv[1:])
