"""Draft families side by side: each family (draft.family) trained on the same extraction with
the same budget, scored standalone, and served by vLLM on the same held-out prompts at
concurrency 1, against the target alone measured in the same run:

    eyas bench family RUN_DIR [FAMILY ...] [--prompts 16] [--max-new-tokens 64] [--k 3]
                              [--json PATH]

RUN_DIR is a run that went through prepare and extract (the demo: runs/demo). Every family
trains under RUN_DIR/families/NAME with the run's own train and draft settings (so the same
samples, epochs, batch size, learning rate and optimizer steps: the budget), its
`draft.family` set, and for dflash a block of k+1 (vLLM serves a block of B as B-1 drafts).
A family already trained with the same settings is reused.

Printed per family: trained draft parameters (the target's embedding, shared, not counted),
training tokens/s, held-out accuracy per position (teacher-forced, in-vocabulary), the τ it
predicts at k, the τ vLLM serves at k (± its 95 % interval) and its per-position acceptance,
served / predicted, time per output token at concurrency 1 with the draft and without, their
ratio (below 1: the draft pays), and whether the greedy output was the target's.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def train_family(run: Path, family: str, train, draft, target, k: int) -> dict:
    import torch

    from eyas.draft.eagle3.accuracy import evaluate_draft
    from eyas.draft.load import load
    from eyas.store.reader import ExtractedDataset
    from eyas.targets.parts import target_parts
    from eyas.train.loop import train_draft

    draft = replace(draft, family=family, block_size=k + 1 if family == "dflash" else None,
                    **({"num_layers": None} if family in ("eagle3", "eagle3.1") else {}))
    out = run / "families" / family
    settings = {"train": asdict(train), "draft": asdict(draft)}
    record = out / "family.json"
    if record.exists() and json.loads(record.read_text())["settings"] == settings:
        return json.loads(record.read_text())
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)  # a vLLM boot before this one left it at 1
    for old in (out / "checkpoints").glob("step-*"):  # another setting's: start afresh
        import shutil
        shutil.rmtree(old)
    outcome = train_draft(str(run / "extract"), target, str(out), train, draft)
    embed, head = target_parts(target)
    model = load(outcome.draft_dir, embed).draft
    params = sum(p.numel() for name, p in model.named_parameters()
                 if p.requires_grad and not name.startswith("embed_tokens"))
    with torch.no_grad():
        acc = evaluate_draft(model, ExtractedDataset(run / "extract", "heldout"), head, k,
                             batch_size=8)
    report = {"settings": settings, "draft_dir": outcome.draft_dir, "params": params,
              "steps": outcome.steps, "tokens_per_s": outcome.tokens_per_s,
              "in_vocab": acc.in_vocab, "conditional": acc.conditional,
              "predicted_tau": acc.predicted_tau}
    record.write_text(json.dumps(report, indent=1))
    return report


def serve(target, draft_dir, prompts, k: int, max_new_tokens: int, serve_cfg=None):
    """Concurrency 1: (Point of eyas.serve.latency), the prompts one at a time, in the run's
    serving dtype and threads (`serve_cfg`)."""
    from eyas.conversations.prompt_sets import Conversation
    from eyas.engines.vllm_engine import VllmEngine
    from eyas.serve.latency import measure
    from eyas.serve.parity import engine_options

    options = engine_options(max(map(len, prompts)) + max_new_tokens + k + 1, serve_cfg)
    conversations = [Conversation(prompt_ids=tuple(p)) for p in prompts]
    with VllmEngine(target, draft_dir, k if draft_dir else 0, options) as engine:
        def generate(wave, n):
            result = engine.generate(wave, n)
            return result.outputs, result.wall_s, result.acceptance, result.timings
        generate(prompts[:1], 2)  # warm-up
        return measure(generate, conversations, max_new_tokens, 1)


def main(argv: list[str]) -> dict:
    from eyas.draft.families import FAMILIES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("families", nargs="*", help=f"default: all of {list(FAMILIES)}")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the table here")
    a = p.parse_args(argv)
    unknown = [f for f in a.families if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {list(FAMILIES)}")
    import torch
    torch.set_num_threads(2)

    from eyas.evaluate.measured import heldout_prompts
    from eyas.store.reader import ExtractedDataset
    from recipe_bench import run_settings

    run = a.run_dir.resolve()
    train, draft, target, serve_cfg = run_settings(run)
    prompts = heldout_prompts(ExtractedDataset(run / "extract", "heldout"), a.prompts)
    families = a.families or list(FAMILIES)
    reports = {f: train_family(run, f, train, draft, target, a.k) for f in families}
    plain = serve(target, None, prompts, a.k, a.max_new_tokens, serve_cfg)
    rows = []
    for f in families:
        r = reports[f]
        spec = serve(target, r["draft_dir"], prompts, a.k, a.max_new_tokens, serve_cfg)
        acc = spec.acceptance
        row = {"family": f, "params": r["params"], "steps": r["steps"],
               "train_tokens_per_s": r["tokens_per_s"], "in_vocab": r["in_vocab"],
               "predicted_tau": r["predicted_tau"], "served_tau": acc.tau,
               "served_tau_interval": list(acc.tau_interval()),
               "drafts": acc.drafts, "per_position": list(acc.per_position_rate),
               "tpot_ms": 1000 * spec.time_per_token_s,
               "tpot_ms_plain": 1000 * plain.time_per_token_s,
               "lossless": spec.outputs == plain.outputs}
        row["ratio"] = row["tpot_ms"] / row["tpot_ms_plain"]
        rows.append(row)
        print(f"{f}: served tau {acc.tau:.3f}, time per token {row['tpot_ms']:.1f} ms vs "
              f"{row['tpot_ms_plain']:.1f} ms without", flush=True)
    print(f"\n{len(prompts)} held-out prompts x {a.max_new_tokens} tokens, k={a.k}, greedy, "
          f"concurrency 1; every family {rows[0]['steps'] if rows else 0} optimizer steps on "
          f"{run / 'extract'}")
    print(f"{'family':<9} {'params':>8} {'tok/s':>7} {'acc d0/d1/d2':<17} {'pred τ':>6} "
          f"{'served ±95%':>11} {'srv/pred':>8} {'accept per position':<20} {'ms/tok':>7} "
          f"{'plain':>6} {'ratio':>6} lossless")
    for r in rows:
        accs = "/".join(f"{x:.2f}" for x in r["in_vocab"][:3])
        per = "/".join(f"{x:.2f}" for x in r["per_position"])
        low, high = r["served_tau_interval"]
        print(f"{r['family']:<9} {r['params']:>8} {r['train_tokens_per_s']:>7.0f} {accs:<17} "
              f"{r['predicted_tau']:>6.3f} {r['served_tau']:>6.3f}±{(high - low) / 2:.2f} "
              f"{r['served_tau'] / r['predicted_tau']:>8.3f} {per:<20} {r['tpot_ms']:>7.1f} "
              f"{r['tpot_ms_plain']:>6.1f} {r['ratio']:>6.3f} {r['lossless']}")
    out = {"run": str(run), "k": a.k, "prompts": len(prompts),
           "max_new_tokens": a.max_new_tokens, "rows": rows}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
