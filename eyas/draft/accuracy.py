"""A draft's accuracy per position on stored data, and predicted τ: measured standalone (the
evaluator, the doctor, training's held-out report) or recorded while training (the figure the
evaluate stage's gap alarm holds the standalone measurement to).

No serving engine: the draft is unrolled over a split exactly as in training (eyas/draft/ttt.py,
`unroll` and `counted_rows`), so "position k" here is TTT step k there. Row r of step k drafts
the token after position r+k+1 and is scored against the target's greedy choice there:

    target_choice[p] = argmax(target_head(verifier[p]))   the target's next token after p
    step k, row r: draft proposal = d2t-mapped argmax of logits_k[r]  vs  target_choice[r+k+1]
    E.g. x = [a b c d]: step 0 row 0 sees (h_a, b) and must say what the target says after b;
    step 1 row 0 sees (its own step-0 output, c) and must say what the target says after c.

A row counts only where the token it predicts is loss-masked (an assistant token) and real.

Three accuracies per position k (all in 0..1):
  full         correct / counted rows; a target token outside the draft vocab is a miss
  in_vocab     correct / rows whose target token the draft vocab holds: what training
               reports (TTT StepStats.accuracy), so the two can be compared like for like
  conditional  correct at k among rows whose positions 0..k-1 were all correct (the same
               chain). This is what chain drafting sees: position k is only verified when
               every earlier draft was accepted.

Predicted acceptance length for chain drafting with the evaluated k positions:
    τ = 1 + Σ_k Π_{j<=k} conditional_j
Π_{j<=k} conditional_j estimates P(the first k+1 drafts are all accepted) = P(accepted > k), and
E[accepted] = Σ_k P(accepted > k); the 1 is the token the target adds every verify step. It is
the same quantity engines report as 1 + accepted / drafts (eyas/engines/reference.py).

Caveat: inputs are teacher-forced (step k reads the data's token, as in training). On data the
target wrote itself at temperature 0 that is exactly the chain the engine runs; on other data
it is an estimate.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from eyas.draft.ttt import TTTBatch, collate, counted_rows, unroll
from eyas.layout import HiddenStateLayout


@dataclass
class PositionCounts:
    """Counts for one draft position (TTT step); sums over batches and ranks."""

    counted: int = 0  # rows scored: the predicted token is loss-masked and real
    in_vocab: int = 0  # of those, rows whose target token the draft vocab holds
    correct: int = 0  # rows where the draft's proposal is the target's greedy token
    chain: int = 0  # rows scored whose earlier positions (same row) were all correct
    chain_correct: int = 0  # of those, correct here too

    def add(self, other: "PositionCounts") -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)


@dataclass
class StepAccuracy:
    """Per-position accuracy over a split (or a candidate layout on the probe set)."""

    positions: list[PositionCounts] = field(default_factory=list)
    samples: int = 0

    @property
    def full(self) -> list[float]:
        return [p.correct / max(1, p.counted) for p in self.positions]

    @property
    def in_vocab(self) -> list[float]:
        return [p.correct / max(1, p.in_vocab) for p in self.positions]

    @property
    def conditional(self) -> list[float]:
        return [p.chain_correct / max(1, p.chain) for p in self.positions]

    @property
    def predicted_tau(self) -> float:
        return predicted_tau(self.conditional)

    def to_dict(self) -> dict:
        return {"full": self.full, "in_vocab": self.in_vocab, "conditional": self.conditional,
                "predicted_tau": self.predicted_tau, "samples": self.samples,
                "counted": [p.counted for p in self.positions]}


def predicted_tau(conditional: Sequence[float]) -> float:
    """τ = 1 + Σ_k Π_{j<=k} acc_j. E.g. [0.8, 0.5, 0.5] -> 1 + 0.8 + 0.4 + 0.2 = 2.4."""
    tau, chain = 1.0, 1.0
    for acc in conditional:
        chain *= acc
        tau += chain
    return tau


@torch.no_grad()
def score_batch(draft, batch: TTTBatch, target_head, steps: int) -> list[PositionCounts]:
    """Counts per draft position for one batch (alignment: module docstring)."""
    vocab = draft.vocab
    t = batch.input_ids.shape[1]
    head_dtype = next(target_head.parameters()).dtype  # the head may be float32, the draft not
    counted = counted_rows(batch)  # [B, T]: position p predicts a loss-masked real token
    # [B, T] target ids, the head run on the counted rows alone (-1 elsewhere, never scored)
    target_choice = torch.full_like(batch.input_ids, -1)
    target_choice[counted] = target_head(batch.verifier[counted].to(head_dtype)).argmax(-1)
    # chain[b, r]: rows whose drafts so far were all scored and correct (True before step 0)
    chain = torch.ones_like(counted)
    out = []
    for k, (_, logits) in enumerate(unroll(draft, batch.input_ids, batch.hidden, steps)):
        s = k + 1  # row r of step k is scored against target_choice[r+s]
        rows = max(0, t - s)
        proposal = vocab.to_target(logits[:, :rows].argmax(-1))  # [B, rows], via d2t
        want = target_choice[:, s:]  # [B, rows]
        scored = counted[:, s:]
        hit = (proposal == want) & scored
        held = vocab.t2d.to(want.device)[want] & scored
        alive = chain[:, :rows] & scored
        out.append(PositionCounts(int(scored.sum()), int(held.sum()), int(hit.sum()),
                                  int(alive.sum()), int((alive & hit).sum())))
        chain = torch.zeros_like(chain)
        chain[:, :rows] = alive & hit
    return out


@torch.no_grad()
def evaluate_draft(draft, dataset, target_head, steps: int,
                   layout: HiddenStateLayout | None = None, batch_size: int = 8,
                   max_samples: int | None = None, device: str | torch.device = "cpu"
                   ) -> StepAccuracy:
    """Accuracy of `draft` over `dataset` (an ExtractedDataset split) for `steps` positions.

    `layout` picks the slots fed to the draft and the verifier (default: the dataset's).
    `max_samples` evaluates the first samples only (a quick estimate on a big split).
    Batches are moved to `device`; the draft and the head must already be there. A block
    drafter (DFlash, DSpark) is scored one sample at a time: its one pass drafts a block at
    every row, each block attending to the whole context, so a forward holds about T^2 x block
    scores per head and layer for each sample batched (8 chats of 1024 tokens at DFlash's
    block of 16 passed 24 GiB on a CPU).
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: evaluate at least one draft position")
    if getattr(draft.config, "block_size", None):
        batch_size = 1
    layout = layout or dataset.layout
    layout.expect_draft_inputs(draft.config.num_aux_hidden_states, "the draft's fc")
    was_training = draft.training
    draft.eval()
    total = StepAccuracy([PositionCounts() for _ in range(steps)])
    n = len(dataset) if max_samples is None else min(len(dataset), max_samples)
    # batched by length (the counts are sums: order does not matter), so little is padding
    order = (sorted(range(n), key=dataset.lengths().__getitem__)
             if hasattr(dataset, "lengths") else list(range(n)))
    try:
        for start in range(0, n, batch_size):
            samples = [dataset[i] for i in order[start:start + batch_size]]
            batch = collate(samples, layout, draft.fc.weight.dtype)
            batch = TTTBatch(*(x.to(device) for x in (batch.input_ids, batch.hidden,
                                                      batch.verifier, batch.loss_mask,
                                                      batch.attention_mask)))
            for acc, counts in zip(total.positions, score_batch(draft, batch, target_head, steps)):
                acc.add(counts)
            total.samples += len(samples)
    finally:
        draft.train(was_training)
    return total


# eyas_extra keys of a draft's config.json that eyas/train writes and the doctor reads
DURING_TRAINING = "train_accuracy_during_training"  # [in-vocab accuracy per TTT step]
DURING_TRAINING_COVERS = "train_accuracy_during_training_covers"  # {steps, scored_tokens, ...}


def during_training_record(correct: Sequence[float], in_vocab: Sequence[float], steps: int,
                           first_step: int) -> dict:
    """The eyas_extra entries for accuracy counted while training: per TTT step, `correct`
    and `in_vocab` summed over `steps` optimizer steps (from `first_step`, 1-based) and over
    all ranks. A ratio of sums, not a mean of per-step ratios: every scored token weighs one."""
    return {DURING_TRAINING: [c / max(1.0, v) for c, v in zip(correct, in_vocab)],
            DURING_TRAINING_COVERS: {
                "what": "in-vocab accuracy per TTT step over the last epoch's training batches, "
                        "each scored with the weights of its step (before its update), counts "
                        "summed over all ranks",
                "steps": steps, "first_step": first_step, "last_step": first_step + steps - 1,
                "scored_tokens": [int(v) for v in in_vocab]}}
