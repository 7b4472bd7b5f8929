"""The README's pipeline command, timed as a new user runs it: its `eyas run` arguments, read from
the README itself, into a fresh run directory and an empty target cache (the packaged model is
converted again), as a child process of this one.

  recorded: minutes in all and per stage, served tau with its 95 % interval on the held-out
  split and each prompt set, the concurrency-1 ratio with its interval (and whether it was
  interleaved), lossless, parity, the exit status

    python bench/first_command_bench.py --json docs/records/first_command.json
    python bench/first_command_bench.py --env ONEDNN_MAX_CPU_ISA=AVX2 --json out.json

`--env` emulates another CPU (ONEDNN_MAX_CPU_ISA=AVX2: a CPU without bfloat16 instructions,
where eyas's auto dtype picks float32). The README's "about N minutes" is checked against the
record by tests/unit/test_docs.py.
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
                   sets={s["name"]: {"tau": s["sweep"][0]["tau"],
                                     "tau_interval": s["acceptance"].get("tau_interval"),
                                     "ratio": s["sweep"][0]["ratio"],
                                     "ratio_interval": s["sweep"][0].get("ratio_interval")}
                         for s in serve.get("prompt_sets", [])})
    manifest = run / "prepare" / "manifest.json"
    if manifest.exists():
        splits = json.loads(manifest.read_text()).get("splits", {})
        out["samples"] = {name: s.get("samples") for name, s in splits.items()}
    return out


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                   help="environment of the run (e.g. ONEDNN_MAX_CPU_ISA=AVX2)")
    p.add_argument("--keep", type=Path, help="run here (kept) instead of a temporary folder")
    p.add_argument("--json", type=Path, help="also write the record here")
    a = p.parse_args(argv)
    env = dict(os.environ, **dict(e.split("=", 1) for e in a.env))
    args = [x for x in readme_arguments() if not x.startswith("run_dir=")]
    with tempfile.TemporaryDirectory(prefix="eyas-first-") as tmp:
        base = a.keep.resolve() if a.keep else Path(tmp)
        run, cache = base / "run", base / "targets"  # an empty target cache
        command = [sys.executable, "-m", "workflows.pipeline", *args, f"run_dir={run}",
                   f"target.builtin.cache_dir={cache}"]
        print("running:", " ".join(command), flush=True)
        started = time.time()
        rc = subprocess.run(command, cwd=CHECKOUT, env=env).returncode
        result = {"arguments": args, "env": dict(e.split("=", 1) for e in a.env),
                  **outcome(run, started, time.time(), rc)}
    print(json.dumps(result, indent=1))
    if a.json:
        from record import provenance, write
        write(a.json, [result], provenance(argv),
              {"the README's pipeline command": {"arguments": args, "env": result["env"]}},
              shared=())  # one measurement, no comparison
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
