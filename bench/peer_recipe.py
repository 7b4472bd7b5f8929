"""The peer trainer's recipe on eyas's data, for bench/recipe_bench.py's side-by-side table.

speculators' own EAGLE-3 draft (vllm-project/speculators 0.9.0, `Eagle3DraftModel`: its TTT
forward, attention masks and KL loss, its frozen `lm_head` started from the target's rows, and
AdamW with its trainer's weight decay 0.01) trained on exactly the batches eyas trains on (same
order, same learning-rate schedule, same step decay, gradient clip 1.0, its matmuls in the run's
train.precision as eyas's are), each batch packed into one row with document ids as
speculators' collator does. The weights are then written as an
eyas draft (names mapped as eyas reads any draft: `layers.0.*` is `midlayer.*`), so
the bench scores and serves it exactly as it does eyas's own variants.

Needs speculators==0.9.0 (installed by README's test command).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch


def _packed(batch) -> dict:
    """A TTTBatch as speculators' collator packs it after its `shift_batch`: per sample,
    (token x_{r+1}, hidden h_r, verifier v_{r+1}, loss mask of x_{r+1}, position r+1)."""
    parts = {k: [] for k in ("input_ids", "hidden_states", "verifier_last_hidden_states",
                             "loss_mask", "position_ids", "document_ids")}
    for i in range(batch.input_ids.shape[0]):
        n = int(batch.attention_mask[i].sum())
        parts["input_ids"].append(batch.input_ids[i, 1:n])
        parts["hidden_states"].append(batch.hidden[i, :n - 1])
        parts["verifier_last_hidden_states"].append(batch.verifier[i, 1:n])
        parts["loss_mask"].append(batch.loss_mask[i, 1:n].bool())
        parts["position_ids"].append(torch.arange(1, n))
        parts["document_ids"].append(torch.full((n - 1,), i))
    return {k: torch.cat(v)[None] for k, v in parts.items()}


def train_speculators(data_dir: Path, target: str, out: Path, train, settings,
                      stop_after: int | None = None):
    """Train with speculators' model; returns (eyas draft dir, training tokens/s).
    `stop_after`: only the first steps (of the same schedule), for a speed measurement."""
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import AutoConfig

    from eyas.draft.checkpoint import save_draft
    from eyas.draft.weights import canonical
    from eyas.targets import text_config
    from eyas.train.data import StoredData, batches, steps_per_epoch
    from eyas.train.loop import _lr, build_draft

    torch.manual_seed(train.seed)
    ds = StoredData(data_dir)
    draft, _, vocab = build_draft(ds, target, settings)  # eyas's vocab; the shell to save into
    layer_config = text_config(AutoConfig.from_pretrained(target))
    layer_config.num_hidden_layers = 1  # speculators sizes the draft's depth from this config
    model = Eagle3DraftModel.from_training_args(
        layer_config, t2d=vocab.t2d, d2t=vocab.d2t, draft_vocab_size=vocab.size,
        norm_before_residual=settings.norm_before_residual,
        norm_before_fc=settings.norm_before_fc, norm_output=settings.norm_output,
        fc_norm=settings.fc_norm, ttt_steps=train.ttt_steps, verifier_name_or_path=target,
        target_layer_ids=list(range(1, len(ds.layout.draft_inputs) + 1)),  # metadata only
        draft_attn_impl="sdpa")
    loss = resolve_loss_config("kl_div", "eager")  # its fused loss needs a GPU (triton)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=train.lr, betas=(0.9, train.adam_beta2),
                            weight_decay=0.01)
    total = train.epochs * steps_per_epoch(len(ds), train.batch_size)
    from eyas.progress import progress
    tokens, started = 0, time.perf_counter()
    bar = progress(total=stop_after or total, desc="train speculators' draft", unit="step")
    for step, batch in batches(ds, train.batch_size, train.seed, range(stop_after or total)):
        for group in opt.param_groups:
            group["lr"] = _lr(step, total, train.lr)
        with torch.autocast("cpu", dtype=torch.bfloat16,
                            enabled=getattr(train, "precision", "float32") == "bfloat16"):
            _, value, _ = model(**_packed(batch), ttt_steps=train.ttt_steps,
                                ttt_step_loss_decay=train.step_loss_decay, loss_config=loss)
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        tokens += int(batch.attention_mask.sum())
        bar.update(1)
        bar.set_postfix(loss=f"{float(value):.3f}", refresh=False)
    bar.close()
    tokens_per_s = tokens / (time.perf_counter() - started)
    ours = draft.state_dict()
    wanted = set(ours) - {"embed_tokens.weight", "d2t", "t2d"}  # the target's, eyas's vocab
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            name = canonical(name)  # layers.0.* -> midlayer.*
            if name in wanted:
                ours[name].copy_(tensor)
                wanted.discard(name)
    if wanted:
        raise KeyError(f"speculators' draft has no {sorted(wanted)}")
    draft_dir = out / "draft"
    save_draft(draft, ds.layout, vocab, str(draft_dir), extra={"trained_by": "speculators 0.9.0"})
    return str(draft_dir), tokens_per_s
