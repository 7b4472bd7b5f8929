"""The peer trainers' recipes on eyas's data, for bench/recipe_bench.py's side-by-side table.

`train_speculators`: speculators' own EAGLE-3 draft (vllm-project/speculators 0.9.0,
`Eagle3DraftModel`: its TTT forward, attention masks and KL loss, its frozen `lm_head` started
from the target's rows, and AdamW with its trainer's weight decay 0.01) trained on exactly the
batches eyas trains on (same order, same learning-rate schedule, same step decay, gradient clip
1.0, its matmuls in the run's train.precision as eyas's are), each batch packed into one row
with document ids as speculators' collator does. The weights are then written as an eyas draft
(names mapped as eyas reads any draft: `layers.0.*` is `midlayer.*`), so the bench scores and
serves it exactly as it does eyas's own variants.

Needs speculators==0.9.0 (installed by README's test command).

`train_specforge`: SpecForge's own EAGLE-3 training (sgl-project/SpecForge 0.2.0): its draft
`LlamaForCausalLMEagle3` (bf16 weights, the target's embedding frozen, a randomly initialised
lm_head, its pre-norm recurrence), its `OnlineEagle3Model` forward (training-time test over
`train.ttt_steps`, sdpa attention), its KL loss to the target's distribution over the draft
vocabulary, its 0.8**k step weights, and its `BF16Optimizer` (fp32 master weights, AdamW,
clip 0.5, 1.5 % warmup then cosine), at the run's peak learning rate and step count, on
exactly the batches eyas trains on, shifted as SpecForge's `TargetHead.preprocess` shifts
them. One substitution: its loss's Triton kernel (`LogSoftmaxLoss`, GPU only) is replaced by
the same file's reference `_compute_loss`, and its `torch.compile`d helpers run eagerly. The
weights are then written as an eyas draft whose norm options are SpecForge's architecture
(`norm_before_fc`, `fc_norm`, `norm_before_residual`, `norm_output` off), after checking that
the eyas draft computes SpecForge's logits at every step on the first batch.

Needs specforge==0.2.0, installed by README's test command without its dependencies (they
pin torch 2.11 and sglang 0.5.14; the parts used here need neither).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch



def _bf16(train) -> bool:
    """The run's train.precision as eyas's trainer resolves it on this CPU (auto: bfloat16
    where it is native, eyas/precision.py), so a peer computes in what eyas computes in."""
    from eyas import precision
    return precision.pick(getattr(train, "precision", "float32"),
                          precision.support()) == "bfloat16"


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


def _run_steps(ds, train, steps: range, peer: str, step_fn) -> float:
    """Run `step_fn(step, batch)` (one optimizer step, returning its loss) over eyas's batches
    for `steps`, with a progress bar; returns training tokens/s."""
    from eyas.progress import progress
    from eyas.train.data import batches

    tokens, started = 0, time.perf_counter()
    bar = progress(total=len(steps), desc=f"train {peer} draft", unit="step")
    for step, batch in batches(ds, train.batch_size, train.seed, steps):
        value = step_fn(step, batch)
        tokens += int(batch.attention_mask.sum())
        bar.update(1)
        bar.set_postfix(loss=f"{float(value.detach()):.3f}", refresh=False)
    bar.close()
    return tokens / (time.perf_counter() - started)


def copy_weights(state: dict, draft, peer: str, rename=lambda name: name) -> None:
    """A peer's trained weights into the eyas draft of the same architecture, by name
    (`rename`: the peer's name to eyas's; a tensor reshaped where the peer holds it in another
    shape, as P-EAGLE's mask_hidden); the embedding and the vocabulary maps are the target's
    and eyas's already."""
    ours = draft.state_dict()
    wanted = set(ours) - {"embed_tokens.weight", "d2t", "t2d"}
    with torch.no_grad():
        for name, tensor in state.items():
            if rename(name) in wanted:
                mine = ours[rename(name)]
                mine.copy_(tensor.float().reshape(mine.shape))
                wanted.discard(rename(name))
    if wanted:
        raise KeyError(f"{peer} draft has no {sorted(wanted)}")


def load_into_peer(model, draft, head, peer: str, rename=lambda name: name) -> None:
    """A speculators model (DFlash's family, P-EAGLE) holding an eyas draft's weights (by
    name, `rename`: the peer's name to eyas's; the target's embedding and vocabulary maps
    aside) and the target head's final norm and rows as its verifier's: both sides of a
    comparison from the same weights."""
    ours, theirs = draft.state_dict(), model.state_dict()
    wanted = set(ours) - {"embed_tokens.weight", "d2t", "t2d"}
    with torch.no_grad():
        for key, tensor in theirs.items():
            if rename(key) in wanted:
                tensor.copy_(ours[rename(key)].reshape(tensor.shape))
                wanted.discard(rename(key))
        model.verifier_norm.weight.copy_(head.norm.weight)
        if model.verifier_lm_head.weight.shape == head.lm_head.weight.shape:
            model.verifier_lm_head.weight.copy_(head.lm_head.weight)
        else:  # a draft vocabulary: the target's rows for it, as speculators loads them
            model.verifier_lm_head.weight.copy_(head.lm_head.weight[draft.vocab.t2d])
        model.embed_tokens.weight.copy_(draft.embed_tokens.weight)
    if wanted:
        raise KeyError(f"speculators' {peer} draft has no {sorted(wanted)}")


def speculators_step(model, train, total: int, loss_of):
    """One optimizer step as speculators' trainer takes it on eyas's batches, for `total`
    steps: AdamW over the model's trainable parameters (its trainer's weight decay 0.01), the
    learning rate on eyas's schedule, `loss_of(batch)` under the run's train.precision, the
    gradient clipped to 1.0. Returns step_fn(step, batch) -> loss, for _run_steps."""
    from eyas.train.loop import _lr

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=train.lr, betas=(0.9, train.adam_beta2),
                            weight_decay=0.01)

    def step_fn(step, batch):
        for group in opt.param_groups:
            group["lr"] = _lr(step, total, train.lr)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=_bf16(train)):
            value = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return value
    return step_fn


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
    from eyas.train.data import StoredData, steps_per_epoch
    from eyas.train.loop import build_draft

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
    total = train.epochs * steps_per_epoch(len(ds), train.batch_size)
    step_fn = speculators_step(model, train, total, lambda batch: model(
        **_packed(batch), ttt_steps=train.ttt_steps, ttt_step_loss_decay=train.step_loss_decay,
        loss_config=loss)[1])

    tokens_per_s = _run_steps(ds, train, range(stop_after or total), "speculators'", step_fn)
    copy_weights(model.state_dict(), draft, "speculators'", canonical)  # layers.0.* -> midlayer.*
    draft_dir = out / "draft"
    save_draft(draft, ds.layout, vocab, str(draft_dir), extra={"trained_by": "speculators 0.9.0"})
    return str(draft_dir), tokens_per_s


def _specforge_inputs(batch, head, dtype) -> dict:
    """A TTTBatch as SpecForge's offline trainer feeds OnlineEagle3Model: the target's logits
    from its last hidden state, then `TargetHead.preprocess` (input ids and logits shifted
    left by one, zero-padded; the loss mask unshifted, [B, T, 1])."""
    from specforge.utils import padding

    with torch.no_grad():
        logits = head(batch.verifier.float())
    return {"input_ids": padding(batch.input_ids, left=False),
            "target": padding(logits, left=False),
            "loss_mask": batch.loss_mask[..., None].float(),
            "attention_mask": batch.attention_mask,
            "hidden_states": batch.hidden.to(dtype)}


def check_specforge_copy(model, draft, batch, inputs, steps: int,
                         scheme: str = "inference") -> float:
    """SpecForge's logits at every training-time-test step of one batch (its OnlineEagle3Model
    forward) against the eyas draft's holding its weights (eyas.draft.ttt.unroll in `scheme`;
    SpecForge 0.2.0's sdpa unroll computes the inference one, to 1e-7), in float32 on the
    real rows: the largest difference relative to the logits' scale. Refuses a copy that
    computes something else."""
    from specforge.algorithms.eagle3.model import OnlineEagle3Model

    from eyas.draft.ttt import unroll

    # rebuilt in float32, not cast (a bf16 model's RoPE tables are bf16-rounded buffers), with
    # the target's embedding unrounded as the served draft reads it (frozen, never saved)
    sf = type(model)(model.config, attention_backend="sdpa")
    sf.load_state_dict({**{k: v.float() for k, v in model.state_dict().items()},
                        "embed_tokens.weight": draft.embed_tokens.weight.float()})
    logged, compute = [], sf.compute_logits
    sf.compute_logits = lambda h: logged.append(compute(h)) or logged[-1]
    real = batch.attention_mask.bool()
    with torch.no_grad():
        OnlineEagle3Model(sf, length=steps, attention_backend="sdpa")(
            **{**inputs, "hidden_states": inputs["hidden_states"].float()})
        ours = unroll(draft.float(), batch.input_ids, inputs["hidden_states"].float(), steps,
                      scheme)
    gap = max(float((theirs[real] - mine[real]).abs().max() / theirs[real].abs().max())
              for theirs, (_, mine) in zip(logged, ours, strict=True))
    if gap > 1e-3:
        raise RuntimeError(f"the eyas draft holding SpecForge's weights computes other logits "
                           f"(largest difference {gap:.2e} of their scale)")
    return gap


# what SpecForge's draft computes, in eyas's terms (its recurrence is pre-norm, no input norms)
SPECFORGE_NORMS = {"norm_before_fc": False, "fc_norm": False, "norm_before_residual": False,
                   "norm_output": False}


def specforge_draft(ds, target: str, settings, dtype=torch.float32):
    """(SpecForge's LlamaForCausalLMEagle3 as its trainer builds it: the target's embedding,
    frozen, a random lm_head; the eyas draft of SpecForge's architecture to save it as, the
    target's head, the draft vocabulary). Both share eyas's vocabulary."""
    from dataclasses import replace

    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import AutoConfig

    from eyas.targets import text_config
    from eyas.train.loop import build_draft

    draft, head, vocab = build_draft(ds, target, replace(settings, **SPECFORGE_NORMS))
    config = text_config(AutoConfig.from_pretrained(target))
    config.num_hidden_layers = 1
    config.draft_vocab_size = vocab.size
    config.target_hidden_size = config.hidden_size
    model = LlamaForCausalLMEagle3(config, attention_backend="sdpa")
    with torch.no_grad():
        model.embed_tokens.weight.copy_(draft.embed_tokens.weight)
        model.t2d.copy_(vocab.t2d)
        model.d2t.copy_(vocab.d2t)
    model.freeze_embedding()
    return model.to(dtype), draft, head, vocab


def use_reference_loss() -> None:
    """SpecForge's loss on a CPU: its Triton kernel (LogSoftmaxLoss) replaced by the same
    file's reference `_compute_loss`, its torch.compile'd helpers run eagerly."""
    import torch._dynamo
    import specforge.algorithms.eagle3.model as sf_eagle3
    from specforge.core.loss import _compute_loss

    class ReferenceLoss:
        apply = staticmethod(getattr(_compute_loss, "_torchdynamo_orig_callable", _compute_loss))

    sf_eagle3.LogSoftmaxLoss = ReferenceLoss
    torch._dynamo.config.disable = True


def train_specforge(data_dir: Path, target: str, out: Path, train, settings,
                    stop_after: int | None = None):
    """Train with SpecForge's model, loss and optimizer; returns (eyas draft dir, training
    tokens/s). `stop_after`: only the first steps (of the same schedule)."""
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.optimizer import BF16Optimizer

    from eyas.draft.checkpoint import save_draft
    from eyas.train.data import StoredData, steps_per_epoch

    use_reference_loss()
    torch.manual_seed(train.seed)
    ds = StoredData(data_dir)
    dtype = torch.bfloat16 if _bf16(train) else torch.float32
    model, draft, head, vocab = specforge_draft(ds, target, settings, dtype)
    trainer = OnlineEagle3Model(model, length=train.ttt_steps, attention_backend="sdpa")
    total = train.epochs * steps_per_epoch(len(ds), train.batch_size)
    opt = BF16Optimizer(model, lr=train.lr, total_steps=total)
    first = []  # the first batch and its inputs, for the copy's check

    def step_fn(step, batch):
        inputs = _specforge_inputs(batch, head, dtype)
        first[:] = first or [batch, inputs]
        value = sum(0.8 ** i * p for i, p in enumerate(trainer(**inputs)[0]))  # its ploss_decay
        value.backward()
        opt.step()
        return value

    tokens_per_s = _run_steps(ds, train, range(stop_after or total), "SpecForge's", step_fn)
    copy_weights(model.state_dict(), draft, "SpecForge's")
    check_specforge_copy(model, draft, *first, train.ttt_steps)
    draft_dir = out / "draft"
    save_draft(draft, ds.layout, vocab, str(draft_dir), extra={"trained_by": "specforge 0.2.0"})
    return str(draft_dir), tokens_per_s


# each peer trainer by name (recipe_bench's peer variants, peer_speed's --peers)
TRAINERS = {"speculators": train_speculators, "specforge": train_specforge}
