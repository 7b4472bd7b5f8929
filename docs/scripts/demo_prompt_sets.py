"""Two prompt sets for the demo's built-in target, written as a user would bring them (JSONL),
for the serve benchmark's per-set figures in docs/benchmarks.md:

    python docs/scripts/demo_prompt_sets.py OUT_DIR [--count 32]

- `chats.jsonl`: three-turn chats in MT-bench's `{"turns": [...]}` shape: "Continue this
  code" over a window of a standard-library file the target never trained on, then
  "Continue." twice, so turns 2 and 3 replay the target's own answers;
- `explain.jsonl`: one-turn `{"messages": [...]}` prompts asking to explain such a window, an
  instruction the demo's data never had (the target continues code anyway).

Windows come from the corpus's held-out files (eyas.targets.corpus.stdlib_sources), with a seed
other than the demo data's, so the sets are the same on every machine with the same Python.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def windows(count: int, lines: int = 12, seed: int = 1234) -> list[str]:
    from eyas.targets.corpus import stdlib_sources

    docs = [f.text.splitlines() for f in stdlib_sources().heldout]
    docs = [d for d in docs if len(d) > 4 * lines]
    rng, out = random.Random(seed), []
    while len(out) < count:
        doc = rng.choice(docs)
        start = rng.randrange(len(doc) - lines)
        window = "\n".join(doc[start:start + lines])
        if window.strip():
            out.append(window)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--count", type=int, default=32)
    a = parser.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    code = windows(2 * a.count)
    with open(out / "chats.jsonl", "w") as f:
        for w in code[:a.count]:
            f.write(json.dumps({"turns": [f"Continue this code:\n```python\n{w}\n```",
                                          "Continue.", "Continue."]}) + "\n")
    with open(out / "explain.jsonl", "w") as f:
        for w in code[a.count:]:
            f.write(json.dumps({"messages": [{"role": "user", "content":
                                              f"Explain what this code does:\n```python\n{w}\n```"}]})
                    + "\n")
    print(f"wrote {out / 'chats.jsonl'} and {out / 'explain.jsonl'} ({a.count} each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
