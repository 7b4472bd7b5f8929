"""How long vLLM takes to import and boot on this machine, and how much memory it holds
(docs/engines.md, "Booting vLLM on CPU").

Boots a tiny random Llama twice through eyas.engines.vllm_engine (the settings eyas serves
with): alone, then with an untrained EAGLE-3 draft, and checks that greedy output is the same
both ways. `--multiprocess` uses vLLM's default engine-core + worker processes instead of the
in-process engine (and leaves torch's thread count alone), for comparison. `--json OUT` runs
both, one after the other, each in a child process of its own (a fresh import), and writes
the record (bench/record.py) that docs/engines.md's table is generated from.

    python docs/scripts/vllm_boot_time.py [--multiprocess]
    python docs/scripts/vllm_boot_time.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _tiny


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multiprocess", action="store_true")
    parser.add_argument("--json", help="run both engines, each in its own process, and write "
                                       "the record here")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # a child's figures, for --json
    a = parser.parse_args()
    if a.json:
        return both(a.json)
    multi = a.multiprocess

    started = time.perf_counter()
    import vllm  # noqa: F401  (timed: the import alone is a large part of a cold start)
    import_s = time.perf_counter() - started

    from eyas.engines.vllm_engine import EngineOptions, VllmEngine

    options = (EngineOptions(in_process=False, torch_threads=None) if multi
               else EngineOptions())
    with tempfile.TemporaryDirectory() as tmp:
        target = _tiny.llama(Path(tmp) / "target")
        draft = _tiny.draft(target, ["embed", "block_out:1", "block_out:3"], Path(tmp) / "draft")
        prompts = _tiny.prompts(target)
        print(_tiny.versions())
        print(f"engine: {'multiprocess' if multi else 'in-process, 1 torch thread'}, "
              f"KV cache {options.kv_cache_bytes / 2**20:.0f} MiB, eager, float32")
        print(f"import vllm: {import_s:.1f} s")
        outputs, row = {}, {"engine": "multiprocess" if multi else "in-process",
                            "import_s": import_s}
        for name, d in (("target alone", None), ("target + EAGLE-3 draft (k=3)", draft)):
            with VllmEngine(target, d, 3, options) as engine:
                result = engine.generate(prompts, max_new_tokens=32)
                outputs[name] = result.outputs
                rss = _tiny.rss_gib()
                print(f"{name}: boot {engine.boot_s:.1f} s, generate {result.wall_s:.2f} s, "
                      f"peak RSS of this process {rss:.2f} GiB")
                row["boot_draft_s" if d else "boot_alone_s"] = engine.boot_s
                row["peak_rss_gib"] = rss
        same = len(set(map(str, outputs.values()))) == 1
        print(f"greedy output identical with and without the draft: {same}")
        if a.row:
            Path(a.row).write_text(json.dumps({**row, "identical": same}))


def both(out: str) -> None:
    """Each engine in a child process (a cold start each), then the record of both."""
    record = _tiny.records()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for flags in ([], ["--multiprocess"]):
            row = Path(tmp) / "row.json"
            subprocess.run([sys.executable, __file__, *flags, "--row", str(row)], check=True)
            rows.append(json.loads(row.read_text()))
    settings = {"model": "tiny random Llama, 4 blocks (docs/scripts/_tiny.py)", "k": 3,
                "prompts": 2, "max_new_tokens": 32}
    record.write(out, rows, record.provenance(sys.argv[1:]),
          {r["engine"]: {**settings, "engine": r["engine"]} for r in rows},
          compared=("engine",), shared=())


if __name__ == "__main__":
    main()
