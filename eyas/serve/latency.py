"""What a user feels: time per output token at a given concurrency, with and without the draft.

Speculative decoding is bought for per-request latency at low concurrency, so the serve stage's
headline is concurrency 1 (one request at a time); a sweep over `serve.concurrency` shows
where batching takes the gain away. At concurrency c the prompts run in waves of c requests
submitted together (the last wave may be smaller), the same waves with and without the draft:

    request latency     the wall time of its wave (greedy, ignore_eos: a wave's requests
                        all generate max_new_tokens and finish together)
    time per token      mean over requests of latency / output tokens (prefill included)
    tokens/s            output tokens of all waves / their summed wall time
    ratio               speculative / plain time per token: below 1, the draft pays
    lossless            the greedy outputs with the draft equal those without

E.g. 8 prompts at c=4: two waves of 4; at c=1: eight waves of 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from eyas.acceptance import AcceptanceStats

# generate(prompts, max_new_tokens) -> (outputs, wall seconds, acceptance or None)
Generate = Callable[[list[list[int]], int], tuple[list[list[int]], float, AcceptanceStats | None]]


def concurrency_levels(requested) -> list[int]:
    """Sorted distinct levels, concurrency 1 always among them (the headline)."""
    levels = sorted({1, *map(int, requested)})
    if levels[0] < 1:
        raise ValueError(f"concurrency {levels[0]}: every level must be >= 1")
    return levels


def waves(prompts: list, concurrency: int) -> list[list]:
    return [prompts[i:i + concurrency] for i in range(0, len(prompts), concurrency)]


@dataclass
class Point:
    """One engine at one concurrency over all the prompts."""

    concurrency: int
    outputs: list[list[int]] = field(default_factory=list)
    wall_s: float = 0.0
    per_token_s: list[float] = field(default_factory=list)  # per request
    acceptance: AcceptanceStats | None = None

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def time_per_token_s(self) -> float:
        return sum(self.per_token_s) / len(self.per_token_s) if self.per_token_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def measure(generate: Generate, prompts: list[list[int]], max_new_tokens: int,
            concurrency: int) -> Point:
    point = Point(concurrency)
    for wave in waves(prompts, concurrency):
        outputs, wall, acceptance = generate(wave, max_new_tokens)
        point.outputs += outputs
        point.wall_s += wall
        point.per_token_s += [wall / max(1, len(o)) for o in outputs]
        if acceptance is not None:
            point.acceptance = acceptance if point.acceptance is None else (
                point.acceptance + acceptance)
    return point


def compare(plain: Point, spec: Point) -> dict:
    """One sweep point's numbers, as the serve report and MLflow carry them."""
    if plain.concurrency != spec.concurrency:
        raise ValueError(f"points at concurrency {plain.concurrency} and {spec.concurrency}")
    acceptance = spec.acceptance
    return {"concurrency": spec.concurrency,
            "tau": acceptance.tau if acceptance else None,
            "per_position_acceptance": acceptance.per_position_rate if acceptance else None,
            "time_per_token_ms_spec": 1000 * spec.time_per_token_s,
            "time_per_token_ms_plain": 1000 * plain.time_per_token_s,
            "ratio": (spec.time_per_token_s / plain.time_per_token_s
                      if plain.time_per_token_s > 0 else None),
            "tokens_per_s_spec": spec.tokens_per_s, "tokens_per_s_plain": plain.tokens_per_s,
            "lossless": spec.outputs == plain.outputs, "requests": len(spec.outputs)}
