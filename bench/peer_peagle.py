"""P-EAGLE held to speculators' own trainer over a full run: eyas's P-EAGLE and speculators'
`PEagleDraftModel` (vllm-project/speculators 0.9.0: its packed (anchor, depth) rows, its mask
positions reading mask_token_id and fc(mask_hidden), its flex mask and its loss: the run's
train.loss, speculators' "ce" or "kl_div"), each started from the same initial weights and
trained on exactly the same batches (same order, learning-rate schedule, gradient clip 1.0,
bf16 autocast where eyas uses it), once per seed; then each draft's held-out accuracy per
position and the tau it predicts, scored by the same code (eyas.draft.accuracy.evaluate_draft).

    python bench/peer_peagle.py RUN_DIR [--samples N] [--seeds 0 1 2] [--layers 1]
                                [--set epochs=2 ...] [--json PATH]

What is fed alike (tests/unit/test_peagle_objective.py holds one batch to 1e-5): speculators'
rows shifted as its trainer shifts a P-EAGLE batch, masked one row on (`packed`); its row
sampler at down_sample_ratio 2.0, which keeps every candidate, so both score every chained
row; every depth weighted 1 (eyas: train.step_loss_decay=1), one mean over every row of every
depth. The two differ by design only where their trainers do: speculators' AdamW has its
trainer's weight decay 0.01, eyas's none; speculators' P-EAGLE trains the target's embedding
by default (embed_requires_grad), here frozen on both sides as eyas keeps it; the draft's head
is trained or frozen on both sides as the run's train.freeze_lm_head says.

A seed sets the initial weights and the batch order, so the spread over seeds is each
trainer's run-to-run spread; the verdict is whether eyas's mean lies within speculators'
range. RUN_DIR went through extract; `--samples` trains on its first N training samples.
Needs speculators==0.9.0 (README's test command installs it).
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

KEEP_ALL = 2.0  # down_sample_ratio: depth d asks (N-d)*2**d rows of at most N, so keeps all


def packed(batch, all_tokens: bool = False, shift_mask: int = 1) -> dict:
    """speculators' inputs for eyas's batch: each sample shifted as its trainer's shift_batch
    shifts it (row q: h_q, x_{q+1}, v_{q+1}), its mask `shift_mask` rows further (1: eyas's
    rows, masked by the token a row predicts; 0: speculators' own convention, by the token it
    reads), then packed into one sequence, a document id per sample, as its collator packs
    them. `all_tokens`: every real row in the loss (train.loss_tokens=all)."""
    parts: dict[str, list] = {k: [] for k in ("ids", "hidden", "verifier", "mask", "docs")}
    source = batch.attention_mask if all_tokens else batch.loss_mask
    for b, n in enumerate(batch.attention_mask.sum(1).tolist()):
        mask = source[b, :n].bool()
        mask = torch.cat([mask[shift_mask:], mask.new_zeros(shift_mask)])
        for key, part in (("ids", batch.input_ids[b, 1:n]), ("hidden", batch.hidden[b, :n - 1]),
                          ("verifier", batch.verifier[b, 1:n]), ("mask", mask[1:]),
                          ("docs", torch.full((n - 1,), b))):
            parts[key].append(part)
    return {k: torch.cat(v)[None] for k, v in parts.items()}


def speculators_loss(model, batch, loss_config, depths: int, all_tokens: bool = False,
                     shift_mask: int = 1, documents: bool = True):
    """speculators' P-EAGLE loss on eyas's batch (`documents` False: its samples packed as
    one document)."""
    feed = packed(batch, all_tokens, shift_mask)
    docs = feed["docs"] if documents else torch.zeros_like(feed["docs"])
    _, loss, _ = model(hidden_states=feed["hidden"], input_ids=feed["ids"], document_ids=docs,
                       loss_mask=feed["mask"], verifier_last_hidden_states=feed["verifier"],
                       loss_config=loss_config, num_depths=depths, down_sample_ratio=KEEP_ALL)
    return loss


def peer_model(data, target: str, draft, head, vocab):
    """speculators' PEagleDraftModel holding eyas's draft's weights (and the target's head
    as its verifier's), its embedding frozen as eyas keeps it."""
    from speculators.models.peagle import PEagleDraftModel
    from transformers import AutoConfig

    from eyas.conventions.vllm_checkpoint import NORM_OPTIONS
    from eyas.draft.weights import canonical
    from eyas.targets import text_config
    from peer_recipe import load_into_peer

    config = text_config(AutoConfig.from_pretrained(target))
    config.num_hidden_layers = draft.config.num_layers
    model = PEagleDraftModel.from_training_args(
        config, t2d=vocab.t2d, d2t=vocab.d2t, draft_vocab_size=vocab.size,
        verifier_name_or_path=target,
        target_layer_ids=list(range(1, len(data.layout.draft_inputs) + 1)),  # metadata only
        mask_token_id=draft.config.mask_token_id, draft_attn_impl="eager",
        **{k: getattr(draft.config, k) for k in NORM_OPTIONS})
    load_into_peer(model, draft, head, "P-EAGLE", canonical)  # layers.0.* is eyas's midlayer.*
    model.embed_tokens.weight.requires_grad_(False)
    return model


def train_speculators(data, target: str, out: Path, train, settings) -> dict:
    """speculators' PEagleDraftModel from eyas's initial weights (eyas.train.loop.build_draft
    under the same seed), trained on eyas's batches; written as an eyas draft."""
    from speculators.losses import resolve_loss_config

    from eyas.draft.families import get as get_family
    from eyas.draft.weights import canonical
    from eyas.train.data import steps_per_epoch
    from eyas.train.loop import build_draft
    from peer_recipe import _run_steps, copy_weights, speculators_step

    torch.manual_seed(train.seed)
    draft, head, vocab = build_draft(data, target, settings)
    model = peer_model(data, target, draft, head, vocab)
    model.lm_head.weight.requires_grad_(not train.freeze_lm_head)
    loss = resolve_loss_config({"ce": "ce", "kl": "kl_div"}[train.loss], "eager")
    total = train.epochs * steps_per_epoch(len(data), train.batch_size)
    losses = []

    def loss_of(batch):
        value = speculators_loss(model, batch, loss, train.ttt_steps,
                                 train.loss_tokens == "all")
        losses.append(float(value.detach()))
        return value

    step_fn = speculators_step(model, train, total, loss_of)
    tokens_per_s = _run_steps(data, train, range(total), "speculators' P-EAGLE", step_fn)
    copy_weights(model.state_dict(), draft, "speculators' P-EAGLE", canonical)
    draft_dir = get_family("peagle").save(draft, data.layout, vocab, str(out / "draft"),
                                          {"trained_by": "speculators 0.9.0"})
    return {"draft_dir": str(draft_dir), "steps": total, "tokens_per_s": tokens_per_s,
            "losses": losses}


def main(argv: list[str]) -> dict:
    from peer_dflash import compare, parser, setup, train_eyas

    p = parser(__doc__)
    p.add_argument("--k", type=int, default=3, help="positions scored (the served k)")
    a = p.parse_args(argv)
    run, train, draft, target, data = setup(a)
    train = replace(train, step_loss_decay=1.0)  # the reference's depth weights: 1 each
    settings = replace(draft, family="peagle", num_layers=a.layers, block_size=None)
    return compare(run, data, target, train, settings, a.seeds, a.k,
                   {"eyas": train_eyas, "speculators": train_speculators}, "peer_peagle",
                   argv, a.json, a.samples)


if __name__ == "__main__":
    main(sys.argv[1:])
