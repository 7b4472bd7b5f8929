"""Check benchmark records before comparing them: every side measured under the same settings
(prompts, k, max new tokens, dtype, concurrency, warm-up, engine version, target) but the one
compared, and each record carrying what produced it.

    python bench/validate.py RECORD.json [RECORD.json ...] --compared draft

Sides are pooled over the records given (named FILE:SIDE when several files are given). Exit
status 0 when the comparison stands; 1, with each difference named, when it does not.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import ComparisonError, validate  # noqa: E402

NEEDED = ("commit", "versions", "machine", "command", "date")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path)
    p.add_argument("--compared", nargs="+", default=[],
                   help="what the sides may differ in (e.g. draft, k, family)")
    a = p.parse_args(argv)
    sides, problems = {}, []
    for path in a.records:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            problems.append(f"{path}: unreadable ({e})")
            continue
        missing = [k for k in NEEDED if not record.get("provenance", {}).get(k)]
        if missing:
            problems.append(f"{path}: its provenance lacks {', '.join(missing)}: not a record "
                            "a reader can check; rerun the benchmark with --json")
        for name, side in record.get("sides", {}).items():
            sides[f"{path.name}:{name}" if len(a.records) > 1 else name] = side
    if len(sides) < 2:
        problems.append(f"{len(sides)} side(s) in {', '.join(map(str, a.records))}: nothing "
                        "to compare")
    try:
        validate(sides, tuple(a.compared))
    except ComparisonError as e:
        problems.append(str(e))
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"{len(sides)} sides comparable: they differ in "
              f"{', '.join(a.compared) or 'nothing'} alone")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
