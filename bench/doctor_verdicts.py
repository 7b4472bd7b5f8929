"""The doctor's verdicts on a run's draft rewritten in each format other tools write, with and
without --data, and how decisively the evidence speaks (the paired z of each alternative).

    python bench/doctor_verdicts.py RUN_DIR [DRAFT_DIR]     # DRAFT_DIR: RUN_DIR/train/draft

The rewrites are tests/foreign_drafts.py's (as_eagle3, as_speculators, as_specforge: each names the
upstream files its schema was read from). Cases: correct configs in each format; the ids only
at the top level; no ids (vLLM's default then applies); SGLang-convention ids handed to vLLM;
ids shifted by one block. Printed per case and probe: the verdict, the ids the doctor says to
write, the smallest and largest z over the alternatives, and the undecided alternatives.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from eyas.run_records import RunDir

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def cases(draft: Path, layout, out: Path, embed) -> list[tuple[str, Path, str]]:
    from foreign_drafts import as_eagle3, as_specforge, as_speculators

    from eyas.conventions import sglang, vllm
    ids = vllm.to_ids(layout)
    sgl = sglang.to_ids(layout) if all(s.stream_index() < layout.target.num_layers
                                       for s in layout.draft_inputs) else None
    shifted = [i + 1 for i in ids]
    found = [("eyas", draft, "vllm"),
             ("eagle3, ids in both places", as_eagle3(draft, out / "both", ids, ids), "vllm"),
             ("eagle3, ids top-level only", as_eagle3(draft, out / "top", top=ids), "vllm"),
             ("eagle3, no ids", as_eagle3(draft, out / "none"), "vllm"),
             ("eagle3, ids shifted +1", as_eagle3(draft, out / "shift", shifted, shifted), "vllm"),
             ("speculators", as_speculators(draft, out / "spec", ids, embed), "vllm")]
    if sgl is not None:
        found += [("specforge (SGLang ids)", as_specforge(draft, out / "sf", sgl),
                   "sglang:0.5.23"),
                  ("specforge ids read by vLLM", out / "sf", "vllm")]
    return found


def summary(verdict: dict) -> tuple[str, str, str]:
    weighing = verdict.get("weighing") or {}
    zs = [c["z"] for c in weighing.get("comparisons", [])]
    z = f"z {min(zs):+.1f}..{max(zs):+.1f} over {len(zs)}" if zs else "no evidence"
    undecided = [c["draft_inputs"] for c in weighing.get("comparisons", [])
                 if abs(c["z"]) < 3]
    fix = ""
    engine = verdict.get("engine") or {}
    if engine.get("write"):
        fix = engine["write"]
    return z, fix, f"undecided {undecided}" if undecided else ""


def main(argv: list[str]) -> None:
    import torch
    torch.set_num_threads(2)
    from eyas.store.reader import ExtractedDataset
    from eyas.targets.parts import target_parts
    from workflows import doctor

    run = Path(argv[0]).resolve()
    draft = Path(argv[1]).resolve() if len(argv) > 1 else RunDir.of(run).draft
    from eyas.run_records import target_path
    target = target_path(run)
    layout = ExtractedDataset(RunDir.of(run).extract, "heldout").layout
    names = {doctor.OK: "OK", doctor.FAULT: "FAULT", doctor.BAD_INPUT: "BAD INPUT",
             doctor.INCONCLUSIVE: "INCONCLUSIVE"}
    with tempfile.TemporaryDirectory(prefix="eyas-verdicts-") as tmp:
        tmp = Path(tmp)
        rows = []
        for name, path, engine in cases(draft, layout, tmp, target_parts(target)[0]):
            for probe in ("--data", "own probe"):
                report = tmp / "verdict.json"
                args = ["--draft", str(path), "--target", target, "--engine", engine,
                        "--json", str(report)]
                if probe == "--data":
                    args += ["--data", str(RunDir.of(run).extract)]
                code = doctor.main(args)
                verdict = json.loads(report.read_text()) if report.exists() else {}
                report.unlink(missing_ok=True)
                rows.append((name, engine, probe, names[code], verdict.get("status", ""),
                             *summary(verdict)))
    print(f"\ndoctor verdicts on {draft} (layout {layout.names})")
    for name, engine, probe, code, status, z, fix, undecided in rows:
        print(f"{name:<30} {engine:<14} {probe:<10} {code:<12} {status:<34} {z}"
              + (f"; write {fix}" if fix else "") + (f"; {undecided}" if undecided else ""))


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]) or not sys.argv[1:]:  # usage: the docstring
        print(__doc__)
        sys.exit(0 if sys.argv[1:] else 2)
    main(sys.argv[1:])
