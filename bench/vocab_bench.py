"""How large a draft vocabulary a target needs: coverage of the held-out answers' tokens by the
N most frequent training answer tokens, side by side for several N, on a run's prepared data.

  coverage(N) = held-out loss-masked tokens whose id is among the N most frequent loss-masked
                training ids / all held-out loss-masked tokens
                (a token outside the draft vocabulary can never be drafted: an upper bound on
                position-1 acceptance)
  and the draft lm_head's parameters at each N, against the target's full vocabulary.

    python bench/vocab_bench.py RUN_DIR [N ...]      # RUN_DIR/prepare from a pipeline run
    python bench/vocab_bench.py RUN_DIR --json out.json   # and write the record
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # record

import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from eyas.run_records import RunDir

from eyas.draft.vocab import count_tokens  # noqa: E402

SIZES = (1024, 2048, 4096, 8192, 16384, 32768)


def rows(path: Path):
    table = pq.read_table(path, columns=["input_ids", "loss_mask"])
    return zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist())


def coverage(run_dir: Path, sizes) -> tuple[list[tuple[int, float]], int, int]:
    from eyas.run_records import target_path
    target = target_path(run_dir)
    config = json.loads((Path(target) / "config.json").read_text())
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    train = count_tokens(rows(RunDir.of(run_dir).prepare / "train.parquet"), vocab)
    heldout = count_tokens(rows(RunDir.of(run_dir).prepare / "heldout.parquet"), vocab)
    order = torch.argsort(train, descending=True, stable=True)
    total = int(heldout.sum())
    out = [(n, float(heldout[order[:n]].sum()) / max(1, total)) for n in sizes if n <= vocab]
    return out, vocab, hidden


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    args, out = list(argv), None
    if "--json" in args:
        at = args.index("--json")
        if at + 1 >= len(args):
            raise SystemExit("--json needs the path to write the record to")
        out = args.pop(at + 1)
        args.pop(at)
    run_dir = Path(args[0])
    sizes = [int(n) for n in args[1:]] or list(SIZES)
    table, vocab, hidden = coverage(run_dir, sizes)
    print(f"target vocabulary {vocab}, hidden {hidden}; held-out answer-token coverage:")
    print("draft vocab | coverage | lm_head parameters / the full vocabulary's")
    for n, c in table:
        print(f"{n:>11} | {c:8.4f} | {n * hidden / 1e6:5.2f}M / {vocab * hidden / 1e6:.2f}M "
              f"({n / vocab:.3f})")
    if out:
        from eyas.run_records import target_path
        from record import provenance, write

        manifest = json.loads((RunDir.of(run_dir).prepare / "manifest.json").read_text())
        write(out, {"vocab": vocab, "hidden": hidden,
                    "samples": {k: v.get("samples") for k, v in manifest["splits"].items()},
                    "rows": [{"draft_vocab": n, "coverage": c, "lm_head_share": n / vocab}
                             for n, c in table]},
              provenance(argv, target=target_path(run_dir)),
              {"prepared data": {"run_dir": str(run_dir)}}, shared=())


if __name__ == "__main__":
    main(sys.argv[1:])
