"""What a skew costs: the run's trained draft served by vLLM under each wrong layout the skew
doctor considers (eyas.doctor.candidates.candidate_layouts), forced past eyas's refusal, with
served tau beside the right layout's, measured side by side in one run:

    python bench/skew_cost.py RUN_DIR [--draft DIR] [--prompts 32] [--max-new-tokens 64]
                              [--k 3] [--json PATH] [--no-evidence] [--only-recorded]
                              [--seeds-draft DIR [--seeds-out DIR]]

Per layout: the slots vLLM feeds the draft, the ids written, served tau (greedy, k draft
tokens), the number of drafts (verify steps) it is counted over, and its share of the right
layout's tau; beside it the doctor's paired evidence for that candidate (recorded minus
candidate, nats/token at draft position 1, and its z on the run's probe: eyas.doctor.evidence),
so what the weights say and what serving costs are read on one line.

How a wrong feed is forced: a copy of the draft (same weights) whose config gives vLLM the
candidate's ids, top level and under eagle_config (as eyas.conventions.vllm_checkpoint
writes them), and records the candidate as its layout, so eyas's own pre-boot check
(eyas.engines.vllm_checks) lets it through; that is the refusal being forced past. vLLM
concatenates the captured states in ascending id order, so a permuted feed is served as the
sorted ids with the draft's fc columns (and its input_norm / fc_norm weights) rearranged to
match: fc then sees, slot for slot, the states the permuted feed would give it. A verifier
read after the final norm is a training-time mistake, not a feed: it is listed, not served.

The target is booted with each draft: vLLM sets the target's captured layers from the draft
config at load (EagleModelMixin._set_aux_hidden_state_layers), so a feed is one boot (seconds
for the built-in target). The prompts are the run's held-out prompts, as the serve stage
takes them (eyas.evaluate.measured.heldout_prompts), all served in one batch.

With --seeds-draft DIR (a draft of the same target trained on other slots, as many: the
seeds' [embed, early, middle] where the run's layout is [early, middle, late]), the seeds'
mistake too: DIR's weights in a copy whose config records the run's layout (seeds_copy), the
doctor's verdict on it from the weights' evidence alone, and served tau as its config says
against the same weights fed what they were trained on.

Measured (docs/doctor.md, "What a skew costs"; 32 held-out prompts x 64 tokens, k=3, about 2
minutes here): on the default demo draft, whose norms before fc and the residual make it
indifferent to which block it reads, every wrong feed served 97.9-101.7 % of the right tau.
With the recipe most published drafts have (experiment=published-recipe), a draft trained
with the seeds' mistake serves 2.574 as its config says against 2.739 fed what it was trained
on (94.0 %), and the doctor calls it FAULT (shifted, z -8.3) from its weights alone.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def forced_copy(draft_dir: Path, out: Path, recorded, fed) -> list[int]:
    """A copy of the draft that vLLM, feeding `fed`'s slots in ascending id order, serves as
    the original draft fed `fed` in `fed`'s order. Returns the ids written."""
    import torch
    from safetensors.torch import load_file, save_file

    from eyas.conventions import vllm
    from eyas.conventions.vllm_checkpoint import AUX_IDS_KEY, DRAFT_WEIGHTS_FILE
    from eyas.draft.directory import CONFIG_FILE, LAYOUT_KEY
    from eyas.layout import HiddenStateLayout

    ids = [s.stream_index() for s in fed.draft_inputs]
    order = sorted(range(len(ids)), key=ids.__getitem__)  # sorted position j <- fed slot order[j]
    ascending = HiddenStateLayout(fed.target, tuple(fed.draft_inputs[i] for i in order),
                                  fed.verifier)
    out.mkdir(parents=True)
    for f in draft_dir.iterdir():
        if f.is_file() and f.name not in (CONFIG_FILE, DRAFT_WEIGHTS_FILE):
            shutil.copy2(f, out / f.name)
    tensors = load_file(str(draft_dir / DRAFT_WEIGHTS_FILE))
    if order != sorted(order):
        h = recorded.target.hidden_size
        blocks = lambda t, dim: t.split(h, dim=dim)  # noqa: E731
        tensors["fc.weight"] = torch.cat([blocks(tensors["fc.weight"], 1)[i] for i in order], 1)
        if "input_norm.weight" in tensors:
            tensors["input_norm.weight"] = torch.cat(
                [blocks(tensors["input_norm.weight"], 0)[i] for i in order])
        if "fc_norm.0.weight" in tensors:
            norms = [tensors[f"fc_norm.{i}.weight"] for i in range(len(order))]
            tensors.update({f"fc_norm.{j}.weight": norms[i] for j, i in enumerate(order)})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / DRAFT_WEIGHTS_FILE),
              metadata={"format": "pt"})
    config = json.loads((draft_dir / CONFIG_FILE).read_text())
    written = vllm.to_ids(ascending)
    config[AUX_IDS_KEY] = written
    config["eagle_config"][AUX_IDS_KEY] = written
    config[LAYOUT_KEY] = {**ascending.to_dict(), "norms": config[LAYOUT_KEY].get("norms", {})}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return written


def evidence(run: Path, draft_dir: Path, target_dir: str, recorded, candidates) -> dict:
    """names -> (mean gap, z) of the doctor's paired evidence on the run's probe."""
    from eyas.doctor.evidence import weigh
    from eyas.draft.load import load
    from eyas.store.reader import ExtractedDataset
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    embedding, head = target_parts(target_dir)
    draft = load(draft_dir, embedding, identify(target_dir), examine=True).draft
    probe = ExtractedDataset(RunDir.of(run).extract, "probe")
    weighing = weigh(draft, probe, head, recorded, [(c.layout, c.kind) for c in candidates])
    return {(tuple(c.names), c.kind): (c.mean_gap, c.z) for c in weighing.comparisons}


def seeds_copy(draft_dir: Path, out: Path, claimed=None):
    """The seeds' mistake as a draft: `draft_dir`'s weights (trained on its recorded layout)
    in a copy whose config records `claimed` (a HiddenStateLayout of as many slots; the run's
    own, say [block_out:1, block_out:14, block_out:26] for a draft trained on [embed,
    block_out:1, block_out:14]) or, without it, every slot one block later, as an extraction
    that reads HF hidden_states[k] for block k's output names what it captured. Returns
    (trained, claimed) layouts."""
    from eyas.draft.directory import LAYOUT_KEY, read_config
    from eyas.layout import HiddenStateLayout, LayoutError, Slot

    trained = HiddenStateLayout.from_dict(read_config(draft_dir)[LAYOUT_KEY], str(draft_dir))
    if claimed is not None:
        if (len(claimed.draft_inputs) != len(trained.draft_inputs)
                or claimed.target != trained.target):
            raise SystemExit(f"--seeds-draft {draft_dir}: trained on {trained.names} of "
                             f"{trained.target.architecture}; the run's layout {claimed.names} "
                             "is not as many slots of the same target")
        claimed = HiddenStateLayout(trained.target, claimed.draft_inputs, trained.verifier)
        forced_copy(draft_dir, out, trained, claimed)
        return trained, claimed
    n = trained.target.num_layers
    try:
        claimed = HiddenStateLayout(trained.target, tuple(
            Slot.at_stream_index(s.stream_index() + 1, n) for s in trained.draft_inputs),
            trained.verifier)
    except LayoutError as e:
        raise SystemExit(f"--seeds-draft {draft_dir}: its slots {trained.names} cannot all be "
                         f"named one block later ({e}); train it on the run's layout shifted "
                         "by -1, e.g. extract.layout.draft_inputs=[embed,block_out:0,"
                         "block_out:1] for [block_out:0,block_out:1,block_out:2]") from None
    forced_copy(draft_dir, out, trained, claimed)
    return trained, claimed


def served_tau(target_dir, draft_dir, k, options, prompts, max_new_tokens) -> dict:
    from eyas.engines.vllm_engine import VllmEngine

    started = time.perf_counter()
    with VllmEngine(target_dir, draft_dir, k, options) as engine:
        result = engine.generate(prompts, max_new_tokens)
    acc = result.acceptance
    return {"tau": acc.tau, "drafts": acc.drafts, "seconds": time.perf_counter() - started,
            "per_position": list(acc.per_position_rate), "engine": result.engine_version}


def seeds_mistake(run: Path, seeds_draft: Path, out: Path, target_dir, serve,
                  claimed=None) -> dict:
    """The seeds' mistake end to end: the copy (seeds_copy), the doctor's verdict on it from
    the weights' evidence alone (training_data=False: no training accuracy is held against
    it), and served tau as its config says against the same weights fed what they were
    trained on."""
    from eyas.doctor.run import diagnose_run

    if out.exists():
        raise SystemExit(f"--seeds-out {out} exists: name a new directory (nothing is "
                         "overwritten)")
    trained, claimed = seeds_copy(seeds_draft, out, claimed)
    verdict = diagnose_run(RunDir.of(run).extract, out, target_dir, training_data=False)
    fitted = verdict.weighing.better if verdict.fitted is not None else None  # the doctor's call
    print(f"\nthe seeds' mistake: {seeds_draft} (trained on {trained.names}) recorded as "
          f"{claimed.names} in {out}\ndoctor (weights' evidence alone): {verdict.status}"
          + (f": fits {fitted.names} better by {-fitted.mean_gap:.3f} nats/token, z "
             f"{fitted.z:+.1f}" if fitted else ""), flush=True)
    from eyas.serve.run import preflight  # what the serve stage and eyas compare run first
    refused = [f.name for f in preflight(target_dir, out, RunDir.of(run).extract, "vllm")["findings"]]
    print(f"the serve stage's checks before any engine boots: "
          f"{'refused (' + ', '.join(refused) + ')' if refused else 'admitted'}", flush=True)
    rows = []
    for name, draft, fed in (("as its config says", out, claimed),
                             ("fed what it was trained on", seeds_draft, trained)):
        rows.append({"draft": name, "fed": fed.names, **serve(draft)})
        print(f"served {name} ({fed.names}): tau {rows[-1]['tau']:.3f}", flush=True)
    for row in rows:
        row["share"] = row["tau"] / rows[1]["tau"]
    return {"trained": trained.names, "claimed": claimed.names, "copy": str(out),
            "doctor": verdict.status, "fitted": fitted.names if fitted else None,
            "gap": fitted.mean_gap if fitted else None, "z": fitted.z if fitted else None,
            "serve_refuses": refused, "rows": rows}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--draft", type=Path, help="default: RUN_DIR/train/draft")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the table here")
    p.add_argument("--no-evidence", action="store_true", help="skip the doctor's evidence")
    p.add_argument("--only-recorded", action="store_true", help="serve the run's draft as "
                   "recorded only, not under every wrong layout (with --seeds-draft: the "
                   "seeds' mistake alone, a few minutes on a real target)")
    p.add_argument("--seeds-draft", type=Path, help="a draft of the same target trained on "
                   "other slots than the run's, as many (another run's RUN2/train/draft, e.g. "
                   "[embed, early, middle] for the run's [early, middle, late]): the seeds' "
                   "mistake is made of it (recorded as the run's layout), examined by the "
                   "doctor and served")
    p.add_argument("--seeds-out", type=Path, help="where the seeds' mistake copy is kept "
                   "(default: a temporary directory), e.g. for eyas doctor or serve.draft")
    a = p.parse_args(argv)

    from dataclasses import replace

    from eyas.doctor.candidates import candidate_layouts
    from eyas.draft.directory import LAYOUT_KEY, read_config
    from eyas.evaluate.measured import heldout_prompts
    from eyas.extract.on_demand import open_split
    from eyas.layout import HiddenStateLayout
    from eyas.serve.parity import engine_options

    run = a.run_dir.resolve()
    draft_dir = (a.draft or RunDir.of(run).draft).resolve()
    from eyas.run_records import target_path
    target_dir = target_path(run)
    recorded = HiddenStateLayout.from_dict(read_config(draft_dir)[LAYOUT_KEY], str(draft_dir))
    candidates = candidate_layouts(recorded)[:1 if a.only_recorded else None]
    prompts = heldout_prompts(open_split(RunDir.of(run).extract, "heldout", states=False), a.prompts)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from recipe_bench import run_settings
    serve_cfg = run_settings(run)[3]  # the run's serving dtype and threads, as serve uses them
    options = replace(engine_options(max(map(len, prompts)) + a.max_new_tokens + a.k + 1,
                                     serve_cfg), max_num_seqs=len(prompts))

    def serve(served):
        return served_tau(target_dir, served, a.k, options, prompts, a.max_new_tokens)

    weighed = ({} if a.no_evidence or a.only_recorded else
               evidence(run, draft_dir, target_dir, recorded, candidates[1:]))
    rows, right = [], None
    with tempfile.TemporaryDirectory(prefix="eyas-skew-") as tmp:
        for i, c in enumerate(candidates):
            row = {"kind": c.kind, "note": c.note, "fed": c.layout.names,
                   "verifier": c.layout.verifier.name}
            row["gap"], row["z"] = weighed.get((tuple(c.layout.names), c.kind), (None, None))
            if c.layout.draft_inputs == recorded.draft_inputs and c.kind != "recorded":
                row["why_not"] = "the same feed (the verifier is a training-time choice)"
                rows.append(row)
                continue
            served = draft_dir if c.kind == "recorded" else Path(tmp) / str(i)
            row["ids"] = (forced_copy(draft_dir, served, recorded, c.layout)
                          if c.kind != "recorded" else
                          read_config(draft_dir)["eagle_aux_hidden_state_layer_ids"])
            row.update(serve(served))
            if c.kind == "recorded":
                right = row["tau"]
            rows.append(row)
            print(f"served {c.layout.names}: tau {row['tau']:.3f} over {row['drafts']} drafts "
                  f"({row['seconds']:.0f} s)", flush=True)
        seeds = (seeds_mistake(run, a.seeds_draft.resolve(),
                               (a.seeds_out or Path(tmp) / "seeds").resolve(), target_dir, serve,
                               recorded)
                 if a.seeds_draft else None)
    for row in rows:
        row["share"] = row["tau"] / right if "tau" in row and right else None
    print(f"\n{draft_dir}: trained on {recorded.names}; vLLM {rows[0]['engine']}, "
          f"k={a.k}, {len(prompts)} held-out prompts x {a.max_new_tokens} tokens, greedy")
    print(f"{'layout':<34} {'slots fed':<42} {'ids':<10} {'served tau':>10} {'drafts':>6} "
          f"{'share':>6}  {'doctor gap':>10} {'z':>6}")
    for row in rows:
        name = (row["kind"] if row["kind"] in ("recorded", "postnorm_verifier")
                else f"{row['kind']} ({row['note']})")
        fed = ", ".join(row["fed"]) + ("" if row["verifier"] == recorded.verifier.name
                                       else f" | verifier {row['verifier']}")
        served = (f"{row['tau']:>10.3f} {row['drafts']:>6} {row['share']:>6.1%}" if "tau" in row
                  else f"{'(' + row['why_not'] + ')':>24}")
        doctor = (f"{row['gap']:>+10.3f} {row['z']:>+6.1f}" if row["z"] is not None else "")
        print(f"{name:<34} {fed:<42} {str(row.get('ids', '')):<10} {served}  {doctor}")
    if seeds:
        print(f"\nthe seeds' mistake (trained on {seeds['trained']}, its config says "
              f"{seeds['claimed']}): doctor {seeds['doctor']}")
        for row in seeds["rows"]:
            print(f"  {row['draft']:<28} {', '.join(row['fed']):<42} {row['tau']:>10.3f} "
                  f"{row['drafts']:>6} {row['share']:>6.1%}")
    out = {"draft": str(draft_dir), "recorded": recorded.names, "k": a.k,
           "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "rows": rows,
           **({"seeds_mistake": seeds} if seeds else {})}
    if a.json:  # the table and its record (bench/record.py): what produced it, per side
        from record import engine_options_of, measured_under, provenance, write
        side = measured_under(prompts, a.max_new_tokens, serve_cfg.dtype, len(prompts), None,
                              target_dir, a.k, rows[0]["engine"],
                              engine_options=engine_options_of(serve_cfg))
        sides = {", ".join(r["fed"]): {**side, "fed": r["fed"]} for r in rows if "tau" in r}
        for r in (seeds or {}).get("rows", []):
            sides[f"seeds' mistake, {r['draft']}"] = {**side, "fed": r["fed"]}
        drafts = {"run": draft_dir, **({"seeds": a.seeds_draft} if seeds else {})}
        write(a.json, out, provenance(argv, target_dir, drafts, prompts), sides,
              compared=("fed",))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
