"""Acceptance counters of chain speculative decoding, engine-neutral.

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


@dataclass(frozen=True)
class AcceptanceStats:
    drafts: int = 0  # verify steps that carried drafted tokens
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self):
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

    @classmethod
    def from_counters(cls, c: dict) -> "AcceptanceStats":
        return cls(int(c["drafts"]), int(c["draft_tokens"]), int(c["accepted"]),
                   tuple(int(x) for x in c.get("accepted_per_position", ())))

    def minus(self, earlier: "AcceptanceStats") -> "AcceptanceStats":
        """Counters accumulated since `earlier` (engines report running totals)."""
        n = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        pad = lambda t: list(t) + [0] * (n - len(t))  # noqa: E731
        return AcceptanceStats(
            self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            tuple(a - b for a, b in zip(pad(self.accepted_per_position),
                                        pad(earlier.accepted_per_position))))

    def to_dict(self) -> dict:
        return {**asdict(self), "accepted_per_position": list(self.accepted_per_position),
                "tau": self.tau, "acceptance_rate": self.acceptance_rate,
                "per_position_rate": self.per_position_rate}


def simulate_chain(outputs: list[list[int]], proposals, k: int, max_new_tokens: int
                   ) -> AcceptanceStats:
    """Counters a greedy chain-drafting engine reports for these greedy outputs.

    `outputs[r]` is request r's greedy continuation, at least max_new_tokens + k long (the
    last verify step may accept tokens past max_new_tokens; engines count them).
    `proposals(r, committed)` -> the k tokens drafted after `committed` tokens of outputs[r].
    The first token comes from prefill; each step then drafts k, accepts the longest prefix
    equal to the target's greedy tokens, and emits one token more.
    """
    import torch

    from eyas.specdec import count_rounds, verify_greedy  # specdec builds on this module

    accepted_per_round = []
    for r, out in enumerate(outputs):
        if len(out) < max_new_tokens + k:
            raise ValueError(f"output {r} has {len(out)} tokens; simulating needs "
                             f"max_new_tokens + k = {max_new_tokens + k}")
        pos = 1
        while pos < max_new_tokens:
            guess = torch.tensor(list(proposals(r, pos)))
            n, _ = verify_greedy(guess, torch.tensor(out[pos:pos + k + 1]))
            accepted_per_round.append(n)
            pos += n + 1
    return count_rounds(accepted_per_round, k)
