"""Acceptance of greedy chain speculative decoding: the verify step and its counters, the one
place acceptance is counted (the reference engine, the evaluator and vLLM's metrics all end in
an `AcceptanceStats`).

One verify step of a request with k drafted tokens accepts a in 0..k of them (the first
rejection ends the step) and always emits one more token from the target, so it advances
a + 1 tokens. Counted over all steps ("drafts"):
  draft_tokens = sum k,  accepted = sum a,  accepted_per_position[i] = #steps with a > i
  tau (mean acceptance length) = 1 + accepted / drafts   (tokens per target forward)
E.g. k = 3, steps accepting [3, 0, 1]: drafts 3, draft_tokens 9, accepted 4,
per position [2, 1, 1] -> rates [0.667, 0.333, 0.333], tau = 1 + 4/3 = 2.33.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch


def verify_greedy(draft_tokens: torch.Tensor, target_argmax: torch.Tensor
                  ) -> tuple[int, torch.Tensor]:
    """One verify step of greedy chain drafting.

    draft_tokens   [k]    the draft's proposals d_1..d_k after the context c
    target_argmax  [k+1]  the target's greedy token after c, c+d_1, ..., c+d_1..d_k
                          (one target forward over c + d gives all k+1)
    Returns (n accepted, the n+1 tokens to append): d_1..d_n then the target's own token.
    E.g. d = [5, 7, 9], target = [5, 7, 2, 4] -> (2, [5, 7, 2]).
    """
    k = draft_tokens.shape[0]
    if target_argmax.shape[0] != k + 1:
        raise ValueError(f"{k} draft tokens need {k + 1} target tokens, got "
                         f"{target_argmax.shape[0]}")
    # gpt-fast accepts d_i with probability min(1, q(d_i) / p(d_i)) (q: target prob, p: draft
    # prob). Greedy makes both one-hot, so that ratio is 1 exactly when d_i is the target's
    # argmax and 0 otherwise: accept the longest prefix where they agree.
    agree = (draft_tokens == target_argmax[:k]).long()  # [k]
    n = int(agree.cumprod(0).sum())
    # On a rejection gpt-fast samples max(q - p, 0), renormalized: one-hot, that is the
    # target's argmax. After k acceptances it samples the target's last distribution (the
    # bonus token): its argmax again. Accepted drafts equal target_argmax[:n] anyway, so the
    # emitted tokens are simply the target's first n+1 choices.
    return n, target_argmax[:n + 1]


@dataclass(frozen=True)
class AcceptanceStats:
    drafts: int = 0  # verify steps that carried drafted tokens
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = field(default_factory=tuple)
    # partial sums (one vLLM metric at a time) are checked once whole
    _check: bool = field(default=True, repr=False, compare=False)

    def __post_init__(self):
        if not self._check:
            return
        per = self.accepted_per_position
        if not 0 <= self.accepted <= self.draft_tokens:
            raise ValueError(f"accepted {self.accepted} outside 0..draft_tokens "
                             f"{self.draft_tokens}")
        if per and (sum(per) != self.accepted or any(b > a for a, b in zip(per, per[1:]))
                    or (per and per[0] > self.drafts)):
            raise ValueError(f"accepted per position {list(per)} is not a non-increasing "
                             f"split of accepted={self.accepted} over {self.drafts} drafts")

    @property
    def tau(self) -> float:
        """Mean acceptance length; 1.0 when nothing was drafted."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def per_position_rate(self) -> list[float]:
        """P(position i accepted) over verify steps: a conditional chain, non-increasing."""
        return [a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_position]

    @property
    def conditional_position_rate(self) -> list[float]:
        """P(position i accepted | position i-1 accepted): accepted_per_position[i] over the
        steps that reached it (all drafts at position 0); 0.0 where none reached it. E.g.
        per position [2, 1, 1] over 3 steps: [0.667, 0.5, 1.0]."""
        reached = [self.drafts, *self.accepted_per_position]
        return [reached[i + 1] / reached[i] if reached[i] else 0.0
                for i in range(len(self.accepted_per_position))]

    @property
    def accepted_lengths(self) -> list[int]:
        """How many verify steps accepted 0, 1, ..., k drafts (from the per-position counts:
        a step accepting a counts at positions 0..a-1). E.g. per position [2, 1, 1] over 3
        steps: [1, 1, 0, 1]."""
        per = list(self.accepted_per_position)
        return [self.drafts - (per[0] if per else 0)] + [
            per[a] - (per[a + 1] if a + 1 < len(per) else 0) for a in range(len(per))]

    def tau_interval(self, z: float = 1.96) -> tuple[float, float]:
        """tau ± z standard errors (95 % by default), from the spread of the accepted lengths
        over the verify steps. Steps of one request are not independent (a hard passage rejects
        several in a row), so this is the narrowest honest interval, not a guarantee. E.g.
        steps accepting [3, 0, 1]: tau 2.33, sd 1.53, half-width 1.96 * 1.53 / sqrt(3) = 1.73.
        With no draft or one: (tau, tau)."""
        n = self.drafts
        if n < 2 or not self.accepted_per_position:
            return self.tau, self.tau
        mean = self.accepted / n
        var = sum(count * (a - mean) ** 2
                  for a, count in enumerate(self.accepted_lengths)) / (n - 1)
        half = z * (var / n) ** 0.5
        return self.tau - half, self.tau + half

    @classmethod
    def from_rounds(cls, accepted_per_round: list[int], k: int) -> "AcceptanceStats":
        """The counters of verify rounds that accepted accepted_per_round[r] drafts each."""
        per = [sum(1 for n in accepted_per_round if n > i) for i in range(k)]
        return cls(len(accepted_per_round), k * len(accepted_per_round),
                   sum(accepted_per_round), tuple(per))

    @classmethod
    def from_vllm_metrics(cls, metrics) -> "AcceptanceStats":
        """vLLM's running spec-decode counters (`LLM.get_metrics()`, which needs
        disable_log_stats=False), summed over label sets; zero when it has no draft."""
        total = cls()
        for metric in metrics:
            key = VLLM_METRICS.get(metric.name)
            if key == "accepted_per_position":
                total = total + cls(accepted_per_position=tuple(int(v) for v in metric.values),
                                    _check=False)
            elif key is not None:
                total = total + cls(**{key: int(metric.value)}, _check=False)
        return cls(total.drafts, total.draft_tokens, total.accepted,
                   total.accepted_per_position)  # checked whole

    def _combine(self, other: "AcceptanceStats", sign: int) -> "AcceptanceStats":
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine, theirs = (list(t) + [0] * (n - len(t)) for t in (self.accepted_per_position,
                                                               other.accepted_per_position))
        return AcceptanceStats(
            self.drafts + sign * other.drafts, self.draft_tokens + sign * other.draft_tokens,
            self.accepted + sign * other.accepted,
            tuple(a + sign * b for a, b in zip(mine, theirs)), _check=False)

    def __add__(self, other: "AcceptanceStats") -> "AcceptanceStats":
        """Counters of two generations together (e.g. summed over prompts)."""
        return self._combine(other, 1)

    def minus(self, earlier: "AcceptanceStats") -> "AcceptanceStats":
        """Counters accumulated since `earlier` (engines report running totals)."""
        return self._combine(earlier, -1)

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "_check"},
                "accepted_per_position": list(self.accepted_per_position),
                "tau": self.tau, "tau_interval": list(self.tau_interval()),
                "acceptance_rate": self.acceptance_rate,
                "per_position_rate": self.per_position_rate,
                "accepted_lengths": self.accepted_lengths}


# vLLM's spec-decode counter names -> AcceptanceStats fields; the per-position one is a vector
# of length num_speculative_tokens
VLLM_METRICS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_position",
}
