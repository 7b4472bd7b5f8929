"""DFlash held to speculators' own trainer over a full run: eyas's DFlash and speculators'
`DFlashDraftModel` (vllm-project/speculators 0.9.0: its anchored-block forward, its own anchor
draw `select_anchors`, its exp(-(j-1)/gamma) position weights and its loss (the run's
train.loss: speculators' "ce" or "kl_div"), its frozen head
holding the target's rows), each started from the same initial weights and trained on exactly
the same batches (same order, learning-rate schedule, gradient clip 1.0, bf16 autocast where
eyas uses it), once per seed; then each draft's held-out accuracy per block position and the
tau it predicts, scored by the same code (eyas.draft.accuracy.evaluate_draft).

    python bench/peer_dflash.py RUN_DIR [--samples N] [--seeds 0 1 2] [--block 4]
                                [--layers 1] [--anchors 32] [--set epochs=2 ...] [--json PATH]

A seed sets the initial weights, the batch order and both trainers' anchor draws, so the
spread over seeds is each trainer's run-to-run spread; the verdict is whether eyas's mean
lies within speculators' range. The two differ by design only where their trainers do:
speculators packs a batch into one row (document ids, positions restarting per sample) and
draws `anchors` x batch size anchors over that row, eyas draws `anchors` per sample;
speculators' AdamW has its trainer's weight decay 0.01, eyas's none. eyas trains with
train.freeze_lm_head on here, as the reference's head is frozen.

RUN_DIR went through extract; `--samples` trains on its first N training samples (nested, as
bench/size_bench.py). Needs speculators==0.9.0 (README's test command installs it).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eyas.run_records import RunDir  # noqa: E402


def _packed(batch, all_tokens: bool) -> dict:
    """A TTTBatch as speculators' collator packs it for DFlash: every sample's rows one after
    another in one row, unshifted (DFlash pairs the token at row r with the states of row r),
    positions restarting per sample, document ids telling the samples apart."""
    parts = {k: [] for k in ("input_ids", "hidden_states", "verifier_last_hidden_states",
                             "loss_mask", "position_ids", "document_ids")}
    for i in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[i].sum())
        parts["input_ids"].append(batch.input_ids[i, :n])
        parts["hidden_states"].append(batch.hidden[i, :n])
        parts["verifier_last_hidden_states"].append(batch.verifier[i, :n])
        mask = batch.attention_mask[i, :n] if all_tokens else batch.loss_mask[i, :n]
        parts["loss_mask"].append(mask.long())
        parts["position_ids"].append(torch.arange(n))
        parts["document_ids"].append(torch.full((n,), i))
    return {k: torch.cat(v)[None] for k, v in parts.items()}


def train_speculators(data, target: str, out: Path, train, settings) -> dict:
    """speculators' DFlashDraftModel from eyas's initial weights (eyas.train.loop.build_draft
    under the same seed), trained on eyas's batches; written as an eyas draft."""
    from speculators.losses import resolve_loss_config
    from speculators.models.dflash import DFlashDraftModel
    from transformers import AutoConfig

    from eyas.draft.families import get as get_family
    from eyas.targets import text_config
    from eyas.train.data import steps_per_epoch
    from eyas.train.loop import build_draft
    from peer_recipe import _run_steps, copy_weights, load_into_peer, speculators_step

    torch.manual_seed(train.seed)
    draft, head, vocab = build_draft(data, target, settings)
    layer_config = text_config(AutoConfig.from_pretrained(target))
    layer_config.num_hidden_layers = settings.num_layers or 1
    model = DFlashDraftModel.from_training_args(
        layer_config, t2d=vocab.t2d, d2t=vocab.d2t, draft_vocab_size=vocab.size,
        block_size=settings.block_size, verifier_name_or_path=target,
        target_layer_ids=list(range(1, len(data.layout.draft_inputs) + 1)),  # metadata only
        mask_token_id=draft.config.mask_token_id, draft_attn_impl="eager")
    load_into_peer(model, draft, head, "DFlash")
    # the run's loss in speculators' own terms (its fused kernels need a GPU): its "ce" is the
    # target's greedy token among the draft vocabulary's rows, its "kl_div" the distribution
    loss = resolve_loss_config({"ce": "ce", "kl": "kl_div"}[train.loss], "eager")
    total = train.epochs * steps_per_epoch(len(data), train.batch_size)
    gamma = -1 / math.log(train.step_loss_decay)
    losses = []

    def loss_of(batch):
        _, value, _ = model(**_packed(batch, train.loss_tokens == "all"), loss_config=loss,
                            gamma=gamma, max_anchors=train.anchors * batch.input_ids.shape[0])
        losses.append(float(value.detach()))
        return value

    step_fn = speculators_step(model, train, total, loss_of)
    tokens_per_s = _run_steps(data, train, range(total), "speculators' DFlash", step_fn)
    copy_weights(model.state_dict(), draft, "speculators' DFlash")
    draft_dir = get_family("dflash").save(draft, data.layout, vocab, str(out / "draft"),
                                          {"trained_by": "speculators 0.9.0"})
    return {"draft_dir": str(draft_dir), "steps": total, "tokens_per_s": tokens_per_s,
            "losses": losses}


def train_eyas(data, target: str, out: Path, train, settings) -> dict:
    from eyas.train.loop import train_draft

    for old in (out / "checkpoints").glob("step-*"):  # a bench starts afresh
        import shutil
        shutil.rmtree(old)
    report = train_draft(data, target, str(out), train, settings)
    return {"draft_dir": report.draft_dir, "steps": report.steps,
            "tokens_per_s": report.tokens_per_s, "losses": list(report.losses)}


def scored(run: Path, trained: dict, target, k: int) -> dict:
    """Held-out accuracy per block position and predicted tau, the same code for both."""
    from eyas.draft.accuracy import evaluate_draft
    from eyas.draft.load import load
    from eyas.store.reader import ExtractedDataset
    from eyas.targets.parts import target_parts

    embed, head = target_parts(target)
    with torch.no_grad():
        acc = evaluate_draft(load(trained["draft_dir"], embed).draft,
                             ExtractedDataset(RunDir.of(run).extract, "heldout"), head, k,
                             batch_size=8)
    return {"in_vocab": acc.in_vocab, "predicted_tau": acc.predicted_tau}


def _spread(rows: list[dict], key) -> tuple[float, float, float]:
    values = [key(r) for r in rows]
    return sum(values) / len(values), min(values), max(values)


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every full-run comparison with a peer's trainer takes."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--samples", type=int, help="the first N training samples (default: all)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="train settings changed from the run's, e.g. epochs=2")
    p.add_argument("--json", type=Path, help="also write the table and its record here")
    return p


def setup(a) -> tuple:
    """(run, train settings with --set applied, draft settings, target, training data) of a
    comparison; one seed is refused: it has no run-to-run range to hold eyas to."""
    if len(a.seeds) < 2:
        raise SystemExit("--seeds: at least two, or there is no run-to-run spread to hold "
                         "eyas to")
    torch.set_num_threads(2)
    from family_bench import FirstSamples
    from recipe_bench import changed, run_settings

    from eyas.train.data import StoredData

    run = a.run_dir.resolve()
    train, draft, target, _ = run_settings(run)
    extract = RunDir.of(run).extract
    data = FirstSamples(extract, a.samples) if a.samples else StoredData(extract)
    return run, changed(train, a.set), draft, target, data


def main(argv: list[str]) -> dict:
    p = parser(__doc__)
    p.add_argument("--block", type=int, default=4)
    p.add_argument("--anchors", type=int, default=32, help="per sample")
    a = p.parse_args(argv)
    run, train, draft, target, data = setup(a)
    train = replace(train, anchors=a.anchors, freeze_lm_head=True)
    settings = replace(draft, family="dflash", block_size=a.block, num_layers=a.layers)
    return compare(run, data, target, train, settings, a.seeds, a.block - 1,
                   {"eyas": train_eyas, "speculators": train_speculators}, "peer_dflash",
                   argv, a.json, a.samples)


def compare(run: Path, data, target, train, settings, seeds, k: int, trainers: dict,
            folder: str, argv, json_path, samples) -> dict:
    """Each trainer (name -> fn(data, target, out, train, settings)) once per seed, the
    trainers alternated within a seed so the machine's drift hits both; each draft scored by
    the same code (`scored`, positions 0..k-1); whether eyas's mean predicted tau lies within
    the peer's range over seeds; the record (bench/record.py) at `json_path`."""
    rows = []
    for seed in seeds:
        for name, fn in trainers.items():
            seeded = replace(train, seed=seed)
            out = run / folder / f"{name}-{seed}"
            out.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            trained = fn(data, target, out, seeded, settings)
            row = {"trainer": name, "seed": seed, "steps": trained["steps"],
                   "train_seconds": time.perf_counter() - started,
                   "tokens_per_s": trained["tokens_per_s"], "final_loss": trained["losses"][-1],
                   "draft_dir": trained["draft_dir"], **scored(run, trained, target, k)}
            rows.append(row)
            print(f"{name} seed {seed}: accuracy " + " / ".join(
                f"{x:.3f}" for x in row["in_vocab"]) + f", predicted tau "
                f"{row['predicted_tau']:.3f}", flush=True)
    summary = {}
    for name in trainers:
        mine = [r for r in rows if r["trainer"] == name]
        summary[name] = {"predicted_tau": _spread(mine, lambda r: r["predicted_tau"]),
                         "in_vocab": [_spread(mine, lambda r, j=j: r["in_vocab"][j])
                                      for j in range(k)]}
    peer = next(n for n in trainers if n != "eyas")
    mean, low, high = summary[peer]["predicted_tau"]
    ours = summary["eyas"]["predicted_tau"][0]
    within = low <= ours <= high
    whose = peer + ("'" if peer.endswith("s") else "'s")
    print(f"\npredicted tau: eyas {ours:.4f} (mean of {len(seeds)} seeds) against {whose} "
          f"{mean:.4f} (range {low:.4f}-{high:.4f}): "
          + ("within its run-to-run spread" if within else "OUTSIDE its run-to-run spread"))
    out = {"rows": rows, "summary": summary, "within_spread": within}
    if json_path:
        from record import provenance, write
        shared = {"data": str(RunDir.of(run).extract), "samples": samples or len(data),
                  "settings": {"train": asdict(train), "draft": asdict(settings)},
                  "seeds": list(seeds), "heldout": "the extraction's held-out split"}
        write(json_path, out, provenance(argv, target, {f"{r['trainer']}-{r['seed']}":
                                                        r["draft_dir"] for r in rows}, []),
              {name: {**shared, "trainer": name} for name in trainers},
              compared=("trainer",), shared=("data", "samples", "settings", "seeds"))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
