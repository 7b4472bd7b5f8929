"""Training-time test (TTT): the draft unrolled for several speculative steps, as it runs.

Alignment (vLLM's: draft row r = (token r+1, position r, hidden of position r)). With target
tokens x, draft-input slots h, verifier states v (pre-norm last block output), all [B, T]:

    step 0, row r: hidden fc(h_r),                token x_{r+1}, position r
                   predicts x_{r+2}: target distribution softmax(head(v_{r+1}))
    step k, row r: hidden = what step k-1 feeds back at row r (pre-norm; normed with
                   norm_output; no fc),
                   token x_{r+k+1}, position r+k; predicts x_{r+k+2} against v_{r+k+1}
    E.g. x = [a b c d e]: step 0 row 0 sees (h_a, b) -> c; step 1 row 0 sees (out0_0, c) -> d;
    step 0 row 3 sees (h_d, e) -> past the end, so it is masked out.

Token inputs at k > 0 are the data's tokens (teacher forcing), not the draft's own guesses.
A row counts in the loss where the token it predicts is loss-masked (an assistant token)
(a P-EAGLE draft's row of step k >= 1: where its steps 1..k all predict one, `step_rows`).

Attention across steps ("extend" attention, as HF speculators' flex mask and SpecForge's
`cache_hidden`): at step k, row r attends to step 0's keys at rows <= r (causal) and to its OWN
row's keys of steps 1..k (diagonal). That is exactly the draft's KV cache at inference when the
target's context ends at row r and k tokens have been drafted after it, so every row of every
step is one real inference situation, trained in parallel. RoPE positions advance by one per
step (r+k), as at inference. That is the default scheme (train.ttt_scheme=inference): step 0's
keys at rows r-k+1..r stay visible, as they are in the cache at inference (SafeAILab/EAGLE
issue 247). train.ttt_scheme=specforge trains as SpecForge (and EAGLE's cnets.py) do instead:
those keys hidden, and every step keeping row r at position r (`unroll`).
`tests/unit/test_draft_ttt.py` checks the default scheme against a step-by-step causal rollout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from eyas.config import TRAIN_LOSSES, TTT_SCHEMES, TrainConfig
from eyas.draft.attention import TTTCache
# TargetLabelCache: imported from here too (the ce loss's `labels`)
from eyas.draft.labels import TargetLabelCache, _labels_of  # noqa: F401
from eyas.draft.spec import DraftModel, ParallelDraft


@dataclass
class TTTBatch:
    input_ids: torch.Tensor  # [B, T] int64, target token ids
    hidden: torch.Tensor  # [B, T, n_slots*H_target], the layout's draft inputs, in its order
    verifier: torch.Tensor  # [B, T, H_target], the layout's verifier slot (pre-norm)
    loss_mask: torch.Tensor  # [B, T], 1 where the token is a training target
    attention_mask: torch.Tensor | None = None  # [B, T], 1 = real token; right padding only
    # [B, T] bool: the rows whose drafts are computed and scored (a dflash draft's sampled
    # anchors, train.anchors); None: every row
    anchors: torch.Tensor | None = None
    # [B] int64: each row's index among the training samples (what TargetLabelCache keys on);
    # None where the batch is not drawn from a training set
    sample_ids: torch.Tensor | None = None


def collate(samples, layout, dtype=torch.float32) -> TTTBatch:
    """Right-padded TTTBatch feeding `layout`'s slots, read by name from each sample (an
    eyas.store.reader.Sample: input_ids [T], loss_mask [T], slots {name: [T, H]}).

    The layout need not be the dataset's: on the probe split, which stores every layer, any
    candidate layout can be assembled (that is how the skew doctor tries alternatives).
    """
    from eyas.layout import LayoutError

    names = [s.name for s in layout.draft_inputs]
    for name in (*names, layout.verifier.name):
        if name not in samples[0].slots:
            raise LayoutError(f"slot {name} is not stored in this split (it has "
                              f"{sorted(samples[0].slots)}); only the probe split stores every "
                              "layer")
    longest = max(len(s.input_ids) for s in samples)
    h = layout.target.hidden_size
    b = len(samples)
    ids = torch.zeros(b, longest, dtype=torch.long)
    mask = torch.zeros(b, longest, dtype=torch.bool)
    attn = torch.zeros(b, longest, dtype=torch.long)
    hidden = torch.zeros(b, longest, len(names) * h, dtype=dtype)  # [B, T, n_slots*H]
    verifier = torch.zeros(b, longest, h, dtype=dtype)  # [B, T, H]
    for row, s in enumerate(samples):
        n = len(s.input_ids)
        ids[row, :n], mask[row, :n], attn[row, :n] = s.input_ids, s.loss_mask, 1
        hidden[row, :n] = torch.cat([s.slots[name] for name in names], dim=-1).to(dtype)
        verifier[row, :n] = s.slots[layout.verifier.name].to(dtype)
    return TTTBatch(ids, hidden, verifier, mask, attn)


@dataclass
class StepStats:
    """One TTT step's numbers, as detached tensors so a trainer can sum them over ranks."""

    loss: torch.Tensor  # mean loss (KL or CE: ttt_loss) over the step's positions
    positions: torch.Tensor  # rows counted (loss-masked predicted token)
    in_vocab: torch.Tensor  # of those, rows whose target argmax is in the draft vocab
    correct: torch.Tensor  # rows where draft argmax == target argmax

    @property
    def accuracy(self) -> float:
        """Conditional: among rows whose target argmax the draft can express."""
        return float(self.correct) / max(1, int(self.in_vocab))

    @property
    def full_accuracy(self) -> float:
        """Over all counted rows; a target argmax outside the draft vocab counts as wrong."""
        return float(self.correct) / max(1, int(self.positions))


class TTTResult(NamedTuple):
    loss: torch.Tensor  # scalar, sum over steps of weight_k * step loss_k
    steps: list[StepStats]


def decay_weights(steps: int, decay: float = 1.0) -> list[float]:
    """decay**k for k = 0..steps-1 (EAGLE-3 recipes use 0.8 or 1.0)."""
    return [decay ** k for k in range(steps)]


def _core(draft) -> DraftModel:
    """The model inside a DDP/FSDP-style wrapper (`.module`): attributes are read there,
    while forward calls go through the wrapper so its gradient hooks run."""
    return getattr(draft, "module", draft)


def _check(draft: DraftModel, batch: TTTBatch) -> torch.Tensor:
    b, t = batch.input_ids.shape
    for name, x in (("hidden", batch.hidden), ("verifier", batch.verifier),
                    ("loss_mask", batch.loss_mask)):
        if tuple(x.shape[:2]) != (b, t):
            raise ValueError(f"batch.{name} is {tuple(x.shape)}, input_ids is {(b, t)}")
    if batch.hidden.shape[-1] != draft.fc.in_features:
        raise ValueError(f"batch.hidden has width {batch.hidden.shape[-1]}; the draft's fc "
                         f"takes {draft.config.num_aux_hidden_states} slots x "
                         f"{draft.config.target_hidden_size} = {draft.fc.in_features}")
    attn = (torch.ones_like(batch.input_ids, dtype=torch.bool) if batch.attention_mask is None
            else batch.attention_mask.bool())
    if (attn[:, 1:] & ~attn[:, :-1]).any():
        # causal attention alone keeps right padding out of real rows; left padding would leak
        raise ValueError("attention_mask must be right-padded (1...1 0...0 per row)")
    return attn


def unroll(draft: DraftModel, input_ids: torch.Tensor, hidden: torch.Tensor,
           steps: int, scheme: str = "inference", anchors: torch.Tensor | None = None
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run `steps` TTT steps; per step (fed back [B, T, H], logits [B, T, draft_vocab]).

    input_ids [B, T] are the target's tokens (row r of step k reads token r+k+1; rows past
    the end read 0 and are never scored); hidden [B, T, n_slots*H_target] feeds step 0.
    `scheme` "specforge" trains as SpecForge (and EAGLE's cnets.py) do instead of as vLLM
    infers: every step keeps row r at position r, and step k's row r does not see step 0's
    rows r-k+1..r (train.ttt_scheme; scoring always uses "inference"). `anchors` [B, T] bool
    (a dflash draft's, TTTBatch.anchors): the rows to compute; the others' outputs are 0.
    """
    if scheme not in TTT_SCHEMES:
        raise ValueError(f"TTT scheme {scheme!r}: one of {', '.join(TTT_SCHEMES)}")
    if isinstance(core := _core(draft), ParallelDraft):  # its own drafting, in this alignment
        return core.draft_steps(draft, input_ids, hidden, steps, scheme, **(
            {} if anchors is None else {"anchors": anchors}))
    if anchors is not None:
        raise ValueError("anchors are a dflash draft's (train.anchors): a chain draft computes "
                         "every row")
    b, t = input_ids.shape
    cache = TTTCache()  # step k's keys/values, for the extend attention of later steps
    cache.hide_recent = scheme == "specforge"
    outputs = []
    for k in range(steps):
        s = k + 1
        tokens = torch.cat([input_ids[:, s:], input_ids.new_zeros(b, min(s, t))], dim=1)
        positions = torch.arange(t, device=input_ids.device) + (k if scheme == "inference"
                                                                 else 0)  # row r at r+k
        hidden, logits = draft(tokens, hidden, positions, projected=k > 0, cache=cache)
        outputs.append((hidden, logits))
    return outputs


def counted_rows(batch: TTTBatch, all_tokens: bool = False) -> torch.Tensor:
    """[B, T] bool: the verifier state at p predicts token p+1, a loss-masked real token (with
    `all_tokens`: any real token, the prompt's too)."""
    attn = (torch.ones_like(batch.input_ids, dtype=torch.bool) if batch.attention_mask is None
            else batch.attention_mask.bool())
    counted = torch.zeros_like(attn)
    counted[:, :-1] = attn[:, 1:] if all_tokens else batch.loss_mask[:, 1:].bool() & attn[:, 1:]
    return counted


def step_rows(counted: torch.Tensor, k: int, anchors: torch.Tensor | None = None,
              chained: bool = False) -> torch.Tensor:
    """Step k's [B, T-k-1] bool of scored rows, from `counted` [B, T] (counted_rows): row r
    predicts token r+k+2 (counted at r+k+1), kept to the batch's anchors (if any).

    `chained` (Family.chained_rows, P-EAGLE's reference): a row of step k >= 1 counts only
    where the tokens steps 1..k draft at it all count, as speculators' COD sampling
    (generate_cod_sample_indices) draws a depth's rows among the previous depth's counted
    ones; step 0 counts on its own. E.g. the response starting at token x_10: step 2's row 6
    predicts x_10 but its step 1 predicts x_9, a prompt token, so it is not counted."""
    s = k + 1
    rows = max(0, counted.shape[1] - s)
    mask = counted[:, s:]
    if chained:
        for j in range(2, s):  # step j-1's target at row r: counted at r+j
            mask = mask & counted[:, j:j + rows]
    return _anchored(mask, anchors, rows)


def step_positions(batch: TTTBatch, steps: int, all_tokens: bool = False,
                   chained: bool = False) -> list[int]:
    """Rows each TTT step puts in the loss (`chained`: step_rows'): what a data-parallel
    trainer sums over ranks to normalize."""
    counted = counted_rows(batch, all_tokens)
    return [int(step_rows(counted, k, batch.anchors, chained).sum()) for k in range(steps)]


def pooled(counts: Sequence[float]) -> list[float]:
    """Per-step denominators for one mean over every scored position of every step (DFlash's
    reference objective: a block's positions pooled, each weighted by its decay), from each
    step's count of scored rows (step_positions, summed over ranks)."""
    return [float(sum(counts))] * len(counts)


def _anchored(mask: torch.Tensor, anchors: torch.Tensor | None, rows: int) -> torch.Tensor:
    """A step's [B, rows] mask of scored rows, kept to the batch's anchors (if any)."""
    return mask if anchors is None else mask & anchors[:, :max(0, rows)]


def sample_anchors(batch: TTTBatch, n: int, generator: torch.Generator,
                   all_tokens: bool = False) -> torch.Tensor:
    """[B, T] bool: per sample, `n` rows drawn uniformly (all of them if fewer) among those
    whose bonus token and first draft are both response tokens (row r's block starts at
    x_{r+1} and drafts x_{r+2} first), as DFlash's reference trainers draw their anchors;
    with `all_tokens` (train.loss_tokens=all: the prompt's rows in the loss) both real tokens,
    so that the prompt's rows anchor blocks as they do when every row is an anchor."""
    counted = counted_rows(batch, all_tokens)  # row p: x_{p+1} is a real token in the loss
    eligible = torch.zeros_like(counted)
    eligible[:, :-1] = counted[:, :-1] & counted[:, 1:]
    keys = torch.rand(eligible.shape, generator=generator).to(eligible.device)
    keys = keys.masked_fill(~eligible, 2.0)  # ineligible rows sort last
    chosen = keys.argsort(dim=1)[:, :n]
    anchors = torch.zeros_like(eligible)
    anchors.scatter_(1, chosen, True)
    return anchors & eligible


def _target_side(target_head: nn.Module, verifier: torch.Tensor, scored: torch.Tensor, vocab,
                 t2d: torch.Tensor, loss: str):
    """What the target says at the `scored` [B, T] rows, its head run on those rows alone (a
    49k-token head over padding and prompt rows was a fifth of a training step):
    (choice [B, T] in draft ids, -1 where the draft cannot say it or the row is not scored;
    log-probabilities over the draft vocab [B, T, draft_vocab], 0 off the scored rows, or None
    for ce; ce's label, its most likely draft token [B, T, 1] (0 off the scored rows), or None
    for kl). ce builds neither the [N, V] float32 copy nor a softmax."""
    b, t = scored.shape
    rows = scored.nonzero(as_tuple=True)
    choice = torch.full((b, t), -1, dtype=torch.long, device=verifier.device)
    choice[rows], in_draft = _labels_of(target_head(verifier[rows]), vocab, t2d)
    if loss == "ce":
        best = torch.zeros(b, t, 1, dtype=torch.long, device=verifier.device)
        best[rows] = in_draft.max(-1, keepdim=True).indices
        return choice, None, best
    scored_logp = in_draft.float().log_softmax(-1)
    logp = scored_logp.new_zeros(b, t, scored_logp.shape[-1])
    logp[rows] = scored_logp
    return choice, logp, None


def ttt_loss(draft: DraftModel, batch: TTTBatch, target_head: nn.Module, steps: int = 1, *,
             step_weights: Sequence[float] | None = None,
             denominators: Sequence[float] | None = None,
             all_tokens: bool = False, scheme: str = "inference",
             loss: str = TrainConfig.loss, labels: TargetLabelCache | None = None,
             chained: bool = False) -> TTTResult:
    """Loss and per-step stats of `steps` TTT steps (weights default to 1.0 each).

    `loss` per scored row: "kl", KL(target || draft) over the draft vocab (the target's
    distribution renormalised there), or "ce", cross-entropy on the target's greedy token in
    the draft vocab (its most likely token there).

    The stats count the loss-masked rows; with `all_tokens` the loss covers every real token
    (the prompt's too), so the accuracy reported is still the assistant tokens'.

    Each step's loss is its KL summed over scored rows divided by `denominators[k]` (default:
    this batch's scored rows, i.e. a mean). Data-parallel ranks pass the rows scored over ALL
    ranks, so that the averaged gradient is the global batch's whatever its split.

    A draft with an `auxiliary_loss` (DSpark's confidence head, eyas/draft/dspark/model.py)
    adds its term to each row's KL or CE, so it is weighted and normalised as they are (and
    counted in the step's loss).

    `chained` (Family.chained_rows, P-EAGLE's): a row of step k >= 1 is scored only where
    every token steps 1..k draft there is (step_rows); the stats count the same rows.

    `labels` (ce only): a TargetLabelCache, which runs `target_head` on the samples it has
    not seen and reads the others' labels back; the loss is the same to the bit.
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: need at least one TTT step")
    if loss not in TRAIN_LOSSES:
        raise ValueError(f"loss {loss!r}: one of {', '.join(TRAIN_LOSSES)}")
    weights = list(step_weights) if step_weights is not None else decay_weights(steps)
    if len(weights) != steps:
        raise ValueError(f"{len(weights)} step weights for {steps} steps")
    core = _core(draft)
    _check(core, batch)  # shapes, dtypes and the layout width
    ids = batch.input_ids
    t = ids.shape[1]
    vocab = core.vocab

    with torch.no_grad():
        counted = counted_rows(batch)
        in_loss = counted_rows(batch, all_tokens) if all_tokens else counted
        if labels is None:
            target_choice, target_logp, target_best = _target_side(
                target_head, batch.verifier, counted | in_loss, vocab, core.t2d, loss)
        elif loss != "ce":
            raise ValueError(f"labels are the ce loss's; loss {loss!r} needs the target's "
                             "distribution (no labels)")
        else:  # what _target_side gives: off the scored rows, choice -1 and best 0
            target_choice, best = labels.labels(batch, target_head, vocab, core.t2d,
                                                counted | in_loss)
            target_best, target_logp = best.unsqueeze(-1), None

    # a family's own term per scored row, added to its KL or CE (DSpark's confidence head):
    # (the step's state, its logits, the target's log-probabilities for kl or its best
    # draft token for ce) -> [B, rows]
    auxiliary = getattr(core, "auxiliary_loss", None)
    total, stats = None, []
    for k, (state, logits) in enumerate(unroll(draft, ids, batch.hidden, steps, scheme,
                                               batch.anchors)):
        s = k + 1  # row r of step k is scored against the verifier at r+s (predicting r+s+1)
        rows = max(0, t - s)  # rows past T-s have no target: only their own later steps see them
        mask = step_rows(counted, k, batch.anchors, chained)  # [B, rows]
        loss_mask = step_rows(in_loss, k, batch.anchors, chained)
        if loss == "kl":
            draft_logp = logits[:, :rows].float().log_softmax(-1)  # [B, rows, draft_vocab]
            goal = target_logp[:, s:]
            term = (goal.exp() * (goal - draft_logp)).sum(-1)  # [B, rows]
        else:  # -log softmax at the label, fused; over every row, those past T-s ignored, so
            # that backward needs no zero-filled [B, T, draft_vocab] gradient of a slice
            labels = torch.full(logits.shape[:2], -100, dtype=torch.long, device=ids.device)
            labels[:, :rows] = target_best[:, s:s + rows, 0]
            term = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                                   reduction="none").view(labels.shape)[:, :rows]
        if auxiliary is not None:
            term = term + (auxiliary(state[:, :rows], logits[:, :rows], goal) if loss == "kl"
                           else auxiliary(state[:, :rows], logits[:, :rows],
                                          target_best=target_best[:, s:s + rows, 0]))
        n = mask.sum()
        denominator = (loss_mask.sum().clamp(min=1) if denominators is None
                       else max(1.0, denominators[k]))
        step_loss = (term * loss_mask).sum() / denominator
        total = weights[k] * step_loss if total is None else total + weights[k] * step_loss
        with torch.no_grad():
            choice = target_choice[:, s:]
            hit = (logits[:, :rows].max(-1).indices == choice) & mask  # argmax, faster
            stats.append(StepStats(step_loss.detach(), n, ((choice >= 0) & mask).sum(),
                                   hit.sum()))
    return TTTResult(total, stats)
