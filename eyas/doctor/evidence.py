"""Is the doctor's evidence conclusive? Accuracy alone often is not.

Accuracy is a 0/1 outcome per scored token. On a small probe set (the demo run's: a few
hundred tokens) the candidate layouts' mean accuracies lie within each other's sampling error
(the demo run scored 0.42 for the recorded layout and 0.36-0.43 for ten alternatives), and
ranking them is a coin toss. So the doctor also weighs a paired, continuous measure: for each
scored token at draft position 1 (the step that reads the slots through `fc`), the draft's
log-likelihood of the target's greedy token (what training maximised, in the draft
vocabulary), under the recorded layout and under each candidate, on the SAME tokens. Per
candidate c:

    d_t = ll_recorded(t) - ll_c(t)        positive: the recorded layout explains token t better
    z_c = mean(d) / (std(d) / sqrt(n))    (n scored tokens; a paired z-statistic)

A draft fits the slots it was trained on: under them it predicts the target markedly better.
    every candidate z_c >= Z         conclusive: OK, the draft was trained on what it records
    a candidate z_c <= -Z, and better by at least EFFECT nats/token:
                                     conclusive: that candidate fits better: a FAULT
    otherwise                        INCONCLUSIVE: the candidates within the noise are named,
                                     with what would settle it (more probe samples, or the
                                     engine's features compared tensor by tensor)
Z = 3 (a one-sided chance of about 1 in 700 per candidate under no difference).
E.g. 400 tokens, d with mean 0.05 and std 0.5 -> z = 2.0: inconclusive; mean 0.2 -> z = 8: OK.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from eyas.draft.ttt import TTTBatch, collate, counted_rows, unroll
from eyas.layout import HiddenStateLayout

Z = 3.0
# A candidate that fits better by less than this (nats per token, at draft position 1) is not
# called a fault however consistent: two near-identical layouts (a shift between two blocks
# whose states barely differ) can differ "significantly" by 0.01 nats on thousands of tokens,
# and the draft is then served just as well by either.
EFFECT = 0.05
# Below this accuracy at draft position 1 under every candidate (the target's greedy token,
# full vocabulary) the draft predicts next to nothing, e.g. a damaged lm_head: its likelihoods
# still differ between layouts, by how garbage logits move, not by which slots it was trained
# on, so no layout is called a better fit (INCONCLUSIVE, saying why).
MIN_ACCURACY = 0.05


@torch.no_grad()
def token_log_likelihoods(draft, dataset, target_head, layout: HiddenStateLayout,
                          batch_size: int = 8, position: int = 1) -> torch.Tensor:
    """[n] float64: per scored row at draft `position` (1: the step that reads the slots
    through fc; 2: the next, which reads what the first fed back), log p_draft(target's greedy
    token), in dataset order, the same rows under every layout (the verifier decides only
    WHICH token); NaN where the draft vocabulary lacks that token (`compare` pairs only rows
    both score)."""
    was_training = draft.training
    draft.eval()
    out, k = [], position - 1
    try:
        for start in range(0, len(dataset), batch_size):
            samples = [dataset[i] for i in range(start, min(len(dataset), start + batch_size))]
            batch: TTTBatch = collate(samples, layout, draft.fc.weight.dtype)
            head_dtype = next(target_head.parameters()).dtype
            greedy = target_head(batch.verifier.to(head_dtype)).argmax(-1)
            want = greedy[:, k + 1:]  # step k's row r predicts the token after r + k + 1
            _, logits = unroll(draft, batch.input_ids, batch.hidden, position)[k]
            logp = logits[:, :logits.shape[1] - k - 1].float().log_softmax(-1)
            ids = draft.vocab.to_draft(want)
            picked = logp.gather(-1, ids.clamp(min=0)[..., None])[..., 0].double()
            picked[ids < 0] = math.nan
            out.append(picked[counted_rows(batch)[:, k + 1:]])
    finally:
        draft.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


@dataclass(frozen=True)
class Comparison:
    """The recorded layout against one candidate, on the same tokens."""

    names: list[str]  # the candidate's draft inputs
    kind: str  # its relation to the recorded layout (shifted, permuted, ...)
    mean_gap: float  # mean(ll_recorded - ll_candidate), nats per token
    z: float

    @property
    def settled(self) -> str:
        """"recorded" (it fits better beyond doubt), "candidate", or "" (within the noise)."""
        if self.z >= Z:
            return "recorded"
        return "candidate" if self.z <= -Z and self.mean_gap <= -EFFECT else ""


def compare(recorded: torch.Tensor, candidate: torch.Tensor, names: list[str], kind: str
            ) -> Comparison:
    d = recorded - candidate
    d = d[~d.isnan()]  # rows both layouts score
    n = d.numel()
    if n < 2:
        return Comparison(names, kind, float(d.mean()) if n else 0.0, 0.0)
    se = float(d.std()) / math.sqrt(n)
    mean = float(d.mean())
    z = mean / se if se > 0 else (math.copysign(math.inf, mean) if mean else 0.0)
    return Comparison(names, kind, mean, z)


@dataclass
class Weighing:
    """What the paired evidence says about the recorded layout."""

    tokens: int
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def conclusive(self) -> bool:
        return bool(self.comparisons) and (self.better is not None or all(
            c.settled == "recorded" for c in self.comparisons))

    @property
    def better(self) -> Comparison | None:
        """The candidate that fits better than the recorded layout beyond doubt; of several,
        the one that fits best (the largest gap, not the largest z)."""
        beaten = [c for c in self.comparisons if c.settled == "candidate"]
        return min(beaten, key=lambda c: c.mean_gap) if beaten else None

    @property
    def undecided(self) -> list[Comparison]:
        """The candidates within the noise (or better by less than EFFECT), the closest rivals
        first (lowest z): those a reader and the cost listing see when only a few are named."""
        return sorted((c for c in self.comparisons if not c.settled), key=lambda c: c.z)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "z_threshold": Z, "conclusive": self.conclusive,
                "comparisons": [{"draft_inputs": c.names, "kind": c.kind,
                                 "mean_gap": c.mean_gap, "z": c.z} for c in self.comparisons]}

    def explain(self) -> str:
        if not self.comparisons:
            return "no alternative layout could be built from the stored slots"
        lines = [f"paired evidence: log-likelihood of the target's token at draft position 1 "
                 f"on {self.tokens} tokens, recorded minus candidate (z >= {Z:g}: the recorded "
                 "layout fits better beyond doubt):"]
        for c in sorted(self.comparisons, key=lambda c: c.z):
            lines.append(f"   {str(c.names):<44} {c.kind:<18} {c.mean_gap:+.3f} nats/token  "
                         f"z {c.z:+.1f}")
        return "\n".join(lines)

    def what_would_settle_it(self) -> str:
        undecided = self.undecided
        names = ", ".join(str(c.names) for c in undecided[:4]) + (
            f" (and {len(undecided) - 4} more)" if len(undecided) > 4 else "")
        return (f"the draft fits {names} about as well as its recorded layout on {self.tokens} "
                "tokens: re-extract with more probe samples (extract.probe_samples, the tokens "
                "the evidence is scored on), or hand the doctor the features the engine feeds "
                "(--features), which are matched tensor by tensor")


def weigh(draft, probe, target_head, recorded: HiddenStateLayout,
          candidates: list[tuple[HiddenStateLayout, str]], batch_size: int = 8) -> Weighing:
    """The recorded layout against each (layout, kind) candidate on the probe split."""
    base = token_log_likelihoods(draft, probe, target_head, recorded, batch_size)
    weighing = Weighing(int((~base.isnan()).sum()))
    for layout, kind in candidates:
        other = token_log_likelihoods(draft, probe, target_head, layout, batch_size)
        weighing.comparisons.append(compare(base, other, layout.names, kind))
    return weighing
