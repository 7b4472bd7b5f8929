"""Check benchmark records before comparing them, as a reviewer would: every side measured
under the same settings (prompts, k, max new tokens, dtype, concurrency, warm-up, engine and its
options, target) but the one compared, every side carrying those settings, each record carrying
what produced it from a clean commit (or saying why a dirty one stands), and records pooled into
one comparison made from the same target, prompts, package versions and machine.

    python bench/validate.py RECORD.json [RECORD.json ...] [--compared draft ...]

Sides are pooled over the records given (named FILE:SIDE when several files are given);
--compared defaults to what the records say they compare. Exit status 0 when the comparison
stands; 1, with each reason named, when it does not.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import check  # noqa: E402


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path)
    p.add_argument("--compared", nargs="+", default=[],
                   help="what the sides may differ in (e.g. draft, k, family); default: what "
                        "the records say they compare")
    a = p.parse_args(argv)
    problems = check(a.records, tuple(a.compared))
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"{', '.join(map(str, a.records))}: the comparison stands; its sides differ in "
              f"{', '.join(a.compared) or 'what the records compare'} alone")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
