"""Draft recipes side by side: each variant trained on the same extraction with the same budget,
then scored standalone and served by vLLM on the same held-out prompts.

    python bench/recipe_bench.py RUN_DIR                 # every variant
    python bench/recipe_bench.py RUN_DIR norms-ttt7 ...  # only these
    python bench/recipe_bench.py RUN_DIR --prompts 64 --k 3
    python bench/recipe_bench.py RUN_DIR run run+lr3e-4 --samples 320 --set epochs=2

RUN_DIR is a run that went through prepare and extract (the demo: runs/demo). Each variant
trains under RUN_DIR/recipes/NAME with the run's own train and draft settings plus the
variant's changes, so "same budget" is the run's (the demo: 128 optimizer steps). A variant
already trained with the same settings is not trained again (its report is reused).
"speculators-ttt7", "run+speculators" and "run+specforge" are the peer trainers' recipes
trained by their own model code on the same batches (bench/peer_recipe.py), then scored and
served exactly like eyas's variants.

`--samples N` trains every variant on the extraction's first N training samples (nested, as
bench/size_bench.py; kept apart under RUN_DIR/recipes/first-N/NAME), `--set KEY=VALUE` changes
the run's train settings under every variant (the run variants' base). Every variant is served
interleaved request by request with the target alone (family_bench.serve_interleaved), so the
time-per-token ratio comes with its interval and the machine's drift cancels.

Printed per variant: held-out accuracy at depth 0/1/2 (in-vocabulary, teacher-forced, as
training reports it), the τ those predict at k (evaluate's conditional-accuracy formula),
the τ vLLM serves at k on the same prompts, served / predicted, and training tokens/s.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # peer_recipe

from peer_recipe import SPECFORGE_NORMS  # noqa: E402

NORMS = {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True}
# what every variant starts from, whatever eyas's defaults now are: the recipe before any
# of the options compared here (each variant then sets its own)
BASE_TRAIN = {"adam_beta2": 0.95, "freeze_lm_head": False, "loss_tokens": "assistant",
              "lm_head_init": "target", "ttt_scheme": "inference", "loss": "kl"}
BASE_DRAFT = {"norm_before_fc": False, "fc_norm": False, "norm_before_residual": False,
              "norm_output": False}
# name -> (train overrides, draft overrides)
VARIANTS = {
    "plain-ttt3": ({"ttt_steps": 3}, {}),
    "plain-ttt7": ({"ttt_steps": 7}, {}),
    "norms-ttt3": ({"ttt_steps": 3}, NORMS),
    "norms-ttt7": ({"ttt_steps": 7}, NORMS),
    "norm_before_fc-ttt7": ({"ttt_steps": 7}, {"norm_before_fc": True}),
    "norm_before_residual-ttt7": ({"ttt_steps": 7}, {"norm_before_residual": True}),
    "norm_output-ttt7": ({"ttt_steps": 7}, {"norm_output": True}),
    "norms+frozen_head-ttt7": ({"ttt_steps": 7, "freeze_lm_head": True}, NORMS),
    "norms+beta2_0.999-ttt7": ({"ttt_steps": 7, "adam_beta2": 0.999}, NORMS),
    "norms+no_decay-ttt7": ({"ttt_steps": 7, "step_loss_decay": 1.0}, NORMS),
    "norms+all_tokens-ttt7": ({"ttt_steps": 7, "loss_tokens": "all"}, NORMS),
    "norms+beta2_0.999-ttt3": ({"ttt_steps": 3, "adam_beta2": 0.999}, NORMS),
    "norms+beta2_0.999+all_tokens-ttt7": ({"ttt_steps": 7, "adam_beta2": 0.999,
                                           "loss_tokens": "all"}, NORMS),
    "norms+beta2_0.999+no_decay-ttt7": ({"ttt_steps": 7, "adam_beta2": 0.999,
                                         "step_loss_decay": 1.0}, NORMS),
    "norms+beta2_0.999+random_head-ttt7": ({"ttt_steps": 7, "adam_beta2": 0.999,
                                            "lm_head_init": "random"}, NORMS),
    "norms+beta2_0.999+specforge_ttt-ttt7": ({"ttt_steps": 7, "adam_beta2": 0.999,
                                              "ttt_scheme": "specforge"}, NORMS),
    # SpecForge's own three settings: its "norm_output" is the norm before lm_head (always
    # there), so its recurrence is pre-norm, i.e. vLLM's norm_output off
    "nbf+nbr+beta2_0.999-ttt7": ({"ttt_steps": 7, "adam_beta2": 0.999},
                                 {"norm_before_fc": True, "norm_before_residual": True}),
    # the default again from other seeds (draft init and data order): the noise of one row
    "norms+beta2_0.999-ttt7-seed1": ({"ttt_steps": 7, "adam_beta2": 0.999, "seed": 1}, NORMS),
    "norms+beta2_0.999-ttt7-seed2": ({"ttt_steps": 7, "adam_beta2": 0.999, "seed": 2}, NORMS),
    "norms+beta2_0.999+ce-ttt7": ({"ttt_steps": 7, "adam_beta2": 0.999, "loss": "ce"}, NORMS),
    "norms+beta2_0.999+ce-ttt7-seed1": ({"ttt_steps": 7, "adam_beta2": 0.999, "loss": "ce",
                                         "seed": 1}, NORMS),
    "norms+beta2_0.999+ce-ttt7-seed2": ({"ttt_steps": 7, "adam_beta2": 0.999, "loss": "ce",
                                         "seed": 2}, NORMS),
    "norms+beta2_0.999+ce-ttt3": ({"ttt_steps": 3, "adam_beta2": 0.999, "loss": "ce"}, NORMS),
    # the peer trainer's own model code on the same batches (bench/peer_recipe.py): its three
    # norm options, frozen lm_head, AdamW (beta2 0.999, weight decay 0.01)
    "speculators-ttt7": ({"ttt_steps": 7, "adam_beta2": 0.999, "freeze_lm_head": True}, NORMS),
}
# trained by a peer's own code (bench/peer_recipe.py), not eyas's loop: variant -> its peer
PEER_VARIANTS = {"speculators-ttt7": "speculators", "run+speculators": "speculators",
                 "run+specforge": "specforge"}
# the run's own recipe and one change each (no BASE_*: how a preset's k, steps and learning
# rate were chosen on a real target, docs/recipe.md "SmolLM2-135M-Instruct")
RUN_VARIANTS = {
    "run": ({}, {}),
    "run+lr3e-4": ({"lr": 3e-4}, {}),
    "run+lr3e-3": ({"lr": 3e-3}, {}),
    "run+ttt2": ({"ttt_steps": 2}, {}),
    "run+ttt7": ({"ttt_steps": 7}, {}),
    "run+epochs1": ({"epochs": 1}, {}),
    "run+epochs4": ({"epochs": 4}, {}),
    "run+epochs6": ({"epochs": 6}, {}),
    "run+epochs7": ({"epochs": 7}, {}),  # about speculators' 3 epochs' time (docs/recipe.md)
    # the target's labels computed every step, as before train.target_cache_gib: its speed
    "run+no_label_cache": ({"target_cache_gib": 0}, {}),
    "run+all_tokens": ({"loss_tokens": "all"}, {}),  # the prompt's rows scored too
    "run+all_tokens+epochs3": ({"loss_tokens": "all", "epochs": 3}, {}),
    "run+all_tokens+lr2e-3": ({"loss_tokens": "all", "lr": 2e-3}, {}),
    "run+all_tokens+no_decay": ({"loss_tokens": "all", "step_loss_decay": 1.0}, {}),
    # the run's settings trained by a peer's own model code and loss (bench/peer_recipe.py)
    "run+speculators": ({}, {}),
    "run+specforge": ({}, SPECFORGE_NORMS),  # its draft's architecture, in eyas's terms
}
VARIANTS.update(RUN_VARIANTS)


def changed(train, dotlist: list[str]):
    """`train` with a bench's `--set KEY=VALUE ...` applied (peer_speed, family_bench)."""
    from omegaconf import OmegaConf

    return replace(train, **OmegaConf.to_container(OmegaConf.from_dotlist(dotlist)))


def run_settings(run: Path):
    from omegaconf import OmegaConf

    from eyas.config import DraftConfig, ServeConfig, TrainConfig
    cfg = OmegaConf.load(run / "config.yaml")
    train = TrainConfig(**OmegaConf.to_container(cfg.train))
    draft = DraftConfig(**OmegaConf.to_container(cfg.draft))
    serve = ServeConfig(**OmegaConf.to_container(cfg.serve))
    from eyas.run_records import target_path
    target = target_path(run)
    return train, draft, target, serve


# what eyas did before a key existed, where its default has changed since
BEFORE_KEY = {"train": {"loss": "kl"}, "draft": {}}


def _same(stored: dict, settings: dict) -> bool:
    """The stored settings are these, keys added to eyas since at what eyas did before."""
    from eyas.config import DraftConfig, TrainConfig
    defaults = {"train": {**asdict(TrainConfig()), **BEFORE_KEY["train"]},
                "draft": {**asdict(DraftConfig()), **BEFORE_KEY["draft"]}}
    return all({**{k: v for k, v in settings[g].items() if k not in stored[g]
                   and v == defaults[g][k]}, **stored[g]} == settings[g] for g in settings)


def train_variant(run: Path, name: str, train, draft, target, samples: int | None = None,
                  base_changed: bool = False) -> dict:
    """Variant `name` trained on the run's extraction (its first `samples` training samples),
    or its report reused where the same clean commit trained the same settings."""
    import torch

    from eyas.store.reader import ExtractedDataset
    from eyas.draft.accuracy import evaluate_draft
    from eyas.draft.load import load
    from eyas.targets.parts import target_parts
    from eyas.train.loop import train_draft

    t_over, d_over = VARIANTS[name]
    on_run = name in RUN_VARIANTS
    train = replace(train, **{**({} if on_run else BASE_TRAIN), **t_over})
    draft = replace(draft, **{**({} if on_run else BASE_DRAFT), **d_over})
    out = run / "recipes" / (f"first-{samples}" if samples else "") / name
    settings = {"train": asdict(train), "draft": asdict(draft),
                **({"samples": samples} if samples else {})}
    report_file = out / "recipe.json"
    from record import clean_commit
    commit = clean_commit()
    if report_file.exists():
        report = json.loads(report_file.read_text())
        # reused only where the same code trained it: a record stamps it with this commit
        if _same(report["settings"], settings) and commit and report.get("commit") == commit:
            return report
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)  # a vLLM boot before this one left it at 1
    for old in (out / "checkpoints").glob("step-*"):  # another setting's: start afresh
        import shutil
        shutil.rmtree(old)
    started, seconds = time.perf_counter(), None
    if name == "run" and not samples and not base_changed and (
            RunDir.of(run).stage("train") / "train_report.json").exists():
        # the run's own draft, trained by its train stage with exactly these settings
        trained = json.loads((RunDir.of(run).stage("train") / "train_report.json").read_text())
        draft_dir, tokens_per_s = trained["draft_dir"], trained["tokens_per_s"]
    elif name in PEER_VARIANTS:
        import peer_recipe
        trainer = peer_recipe.TRAINERS[PEER_VARIANTS[name]]
        draft_dir, tokens_per_s = trainer(RunDir.of(run).extract, target, out, train, draft)
        seconds = time.perf_counter() - started  # the training call's wall time, setup included
    else:
        from family_bench import FirstSamples
        data = (FirstSamples(RunDir.of(run).extract, samples) if samples
                else str(RunDir.of(run).extract))
        outcome = train_draft(data, target, str(out), train, draft)
        draft_dir, tokens_per_s = outcome.draft_dir, outcome.tokens_per_s
        seconds = time.perf_counter() - started  # the training call's wall time, setup included
    embed, head = target_parts(target)
    model = load(draft_dir, embed).draft
    heldout = ExtractedDataset(RunDir.of(run).extract, "heldout")
    with torch.no_grad():
        acc = evaluate_draft(model, heldout, head, max(3, train.ttt_steps), batch_size=8)
    report = {"settings": settings, "draft_dir": draft_dir,
              "tokens_per_s": tokens_per_s, "train_seconds": seconds, "in_vocab": acc.in_vocab,
              "conditional": acc.conditional, "full": acc.full}
    report["commit"] = commit  # None from a dirty checkout: never reused
    report_file.write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("variants", nargs="*", help=f"default: all of {list(VARIANTS)}")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1,
                        help="serve the first variant this many times: whether serving one "
                             "draft again gives the same tau")
    parser.add_argument("--samples", type=int,
                        help="train on the extraction's first N training samples")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="train settings changed from the run's under every variant")
    parser.add_argument("--json", type=Path, help="also write the table and its record here "
                        "(bench/record.py; bench/validate.py checks it)")
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    peers = [v for v in args.variants or list(VARIANTS) if v in PEER_VARIANTS]
    if peers and (args.samples or args.set):
        raise SystemExit(f"{', '.join(peers)}: a peer trainer trains on the whole extraction "
                         "with the run's settings; drop --samples/--set, or these variants")
    import torch
    torch.set_num_threads(2)

    from eyas.store.reader import ExtractedDataset
    from eyas.draft.accuracy import predicted_tau
    from eyas.evaluate.measured import heldout_prompts

    run = Path(args.run_dir).resolve()
    train, draft, target, serve_cfg = run_settings(run)
    train = changed(train, args.set)
    prompts = heldout_prompts(ExtractedDataset(RunDir.of(run).extract, "heldout"), args.prompts)
    from family_bench import _served, serve_interleaved

    names = args.variants or list(VARIANTS)
    reports = {name: train_variant(run, name, train, draft, target, args.samples,
                                   bool(args.set)) for name in names}
    drafts = {name: (reports[name]["draft_dir"], args.k) for name in names}
    # the first variant again, on fresh engines: whether serving one draft gives one tau
    repeats = [f"{names[0]} (again {i})" for i in range(1, args.repeat)]
    drafts.update(dict.fromkeys(repeats, drafts[names[0]]))
    served = serve_interleaved(target, drafts, {"heldout": prompts}, args.max_new_tokens,
                               serve_cfg)
    again = [served[n]["heldout"][1].acceptance.tau for n in [names[0], *repeats]]
    rows = []
    for name in names:
        report = reports[name]
        plain, point = served[name]["heldout"]
        acceptance = point.acceptance
        predicted = predicted_tau(report["conditional"][:args.k])
        figures = _served(plain, point, target, serve_cfg.dtype)
        latency = {k: v for k, v in figures.items()  # the acceptance is kept whole, below
                   if k not in ("served_tau", "served_tau_interval", "drafts", "per_position")}
        rows.append((name, report, predicted, acceptance.tau, acceptance, latency))
        print(f"{name}: served tau {acceptance.tau:.3f}, predicted {predicted:.3f}, ratio "
              f"{latency['ratio']:.3f}, lossless {latency.get('lossless')}", flush=True)
    if len(again) > 1:
        print(f"{rows[0][0]} served {len(again)} times: tau " + ", ".join(f"{t:.4f}"
                                                                         for t in again))
    print(f"\n{len(prompts)} held-out prompts x {args.max_new_tokens} tokens, k={args.k}; "
          f"held-out in-vocabulary accuracy per depth (teacher-forced)")
    print(f"{'variant':<36} {'acc d0 / d1 / d2':<23} {'pred tau':>8} {'served':>7} "
          f"{'95%':>6} {'srv/pred':>8} {'train tok/s':>11}")
    for name, report, predicted, served, acceptance, _ in rows:
        acc = " / ".join(f"{a:.3f}" for a in report["in_vocab"][:3])
        lo, hi = acceptance.tau_interval()
        print(f"{name:<36} {acc:<23} {predicted:>8.3f} {served:>7.3f} {(hi - lo) / 2:>6.3f} "
              f"{served / predicted:>8.3f} {report['tokens_per_s']:>11.0f}")
    if args.json:
        from record import engine_options_of, measured_under, provenance, write
        side = measured_under(prompts, args.max_new_tokens, serve_cfg.dtype, 1,
                              "one request of 2 tokens", target, args.k,
                              engine_options=engine_options_of(serve_cfg, interleave=True))
        write(args.json, [{"variant": name, "settings": report["settings"],
                           "in_vocab": report["in_vocab"], "predicted_tau": predicted,
                           "acceptance": acceptance.to_dict(), **latency,
                           **({"served_again_tau": again} if i == 0 and len(again) > 1 else {}),
                           "train_tokens_per_s": report["tokens_per_s"],
                           "train_seconds": report.get("train_seconds")}
                          for i, (name, report, predicted, served, acceptance, latency)
                          in enumerate(rows)],
              provenance(argv, target, {name: r["draft_dir"] for name, r, *_ in rows}, prompts),
              {name: {**side, "recipe": report["settings"]} for name, report, *_ in rows},
              compared=("recipe",))


if __name__ == "__main__":
    main(sys.argv[1:])
