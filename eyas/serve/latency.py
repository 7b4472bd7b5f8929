"""What a user feels: time per output token at a given concurrency, with and without the draft.

Speculative decoding is bought for per-request latency at low concurrency, so the serve stage's
headline is concurrency 1 (one request at a time); a sweep over `serve.concurrency` shows
where batching takes the gain away. At concurrency c the conversations of a prompt set run in
waves of c, a wave's requests submitted together (a multi-turn chat sends its next turn once
its answer is in), the same waves with and without the draft:

    request latency     submission to last token (E2EL; the engine's chunks give TTFT, ITL
                        and TPOT: eyas.engines.timing, vLLM bench serve's definitions)
    time per token      mean over requests of latency / output tokens (prefill included)
    tokens/s            output tokens of all waves / their summed wall time
    ratio               speculative / plain time per token: below 1, the draft pays
    lossless            the greedy outputs with the draft equal those without, or part only
                        at near-ties of the target's own (eyas.serve.lossless: bf16)

E.g. 8 prompts at c=4: two waves of 4; at c=1: eight waves of 1. Each point also carries
vLLM bench serve's metrics under its names (`latency_metrics`: mean/median/std/p90/p99 of
TTFT, TPOT, ITL, E2EL in ms; `spec_decode_metrics`: spec_decode_acceptance_length etc.).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean, median, pstdev
from typing import Callable

from eyas.acceptance import AcceptanceStats
from eyas.conversations.prompt_sets import Conversation, Dialog
from eyas.engines.timing import RequestTiming

# generate(prompts, max_new_tokens) -> (outputs, wall seconds, acceptance or None, per-request
# timings or None: then each request is timed as its wave)
Generate = Callable[[list[list[int]], int],
                    tuple[list[list[int]], float, AcceptanceStats | None,
                          list[RequestTiming] | None]]


def engine_generate(engine, each: Callable[[list[list[int]]], None] | None = None) -> Generate:
    """An engine's generate (eyas.engines: a result with outputs, wall_s, acceptance and
    timings) as a Generate; `each(wave)` runs after every wave (a progress bar's update),
    outside the engine's own timing."""
    def generate(wave, n):
        result = engine.generate(wave, n)
        if each is not None:
            each(wave)
        return result.outputs, result.wall_s, result.acceptance, result.timings
    return generate


# vLLM bench serve's latency metrics (its --percentile-metrics), and the percentiles reported
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)


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
    """One engine at one concurrency over all the requests of a prompt set."""

    concurrency: int
    outputs: list[list[int]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)  # each request's, as sent
    wall_s: float = 0.0
    timings: list[RequestTiming] = field(default_factory=list)  # per request
    acceptance: AcceptanceStats | None = None
    per_request_tau: list[float] = field(default_factory=list)  # with a draft

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def per_token_s(self) -> list[float]:
        return [t.e2el_s / max(1, t.output_tokens) for t in self.timings]

    @property
    def time_per_token_s(self) -> float:
        per = self.per_token_s
        return sum(per) / len(per) if per else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def measure(generate: Generate, conversations: list[Conversation], max_new_tokens: int,
            concurrency: int, render=None, decode=None) -> Point:
    """Waves of `concurrency` conversations; a wave's conversations advance turn by turn
    together (each turn one request; a conversation with fewer turns leaves the wave)."""
    point = Point(concurrency)
    for wave in waves(list(conversations), concurrency):
        dialogs = [Dialog(c, render, decode) for c in wave]
        while active := [d for d in dialogs if not d.done]:
            prompts = [d.prompt() for d in active]
            outputs, wall, acceptance, timings = generate(prompts, max_new_tokens)
            for d, out in zip(active, outputs):
                d.answer(out)
            point.outputs += outputs
            point.prompts += prompts
            point.wall_s += wall
            point.timings += timings or [RequestTiming(wall, len(o)) for o in outputs]
            if acceptance is not None:
                point.acceptance = acceptance if point.acceptance is None else (
                    point.acceptance + acceptance)
                if len(active) == 1:  # one request's own counters (concurrency 1)
                    point.per_request_tau.append(acceptance.tau)
    return point


def measure_interleaved(plain: Generate, spec: Generate, conversations: list[Conversation],
                        max_new_tokens: int, render=None, decode=None) -> tuple[Point, Point]:
    """Concurrency 1 on two engines alive together, request by request A/B/B/A: each
    conversation served by both, the one that goes first alternating, so that a machine
    whose speed drifts (other work, clocks, a neighbour) slows both sides alike and the ratio
    holds still where two runs one after the other drifted apart. (plain Point, spec Point)."""
    points = Point(1), Point(1)
    for i, conversation in enumerate(conversations):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            one = measure((plain, spec)[side], [conversation], max_new_tokens, 1, render, decode)
            point = points[side]
            point.outputs += one.outputs
            point.prompts += one.prompts
            point.wall_s += one.wall_s
            point.timings += one.timings
            point.per_request_tau += one.per_request_tau
            if one.acceptance is not None:
                point.acceptance = one.acceptance if point.acceptance is None else (
                    point.acceptance + one.acceptance)
    return points


def ratio_interval(plain: Point, spec: Point, z: float = 1.96) -> tuple[float, float]:
    """The 95 % interval of the ratio of mean times per token (spec / plain), from the
    requests' paired times (the same request on both sides): the delta method on the two
    means and their covariance. E.g. 16 requests whose per-token times vary by 10 % on both
    sides alike give a narrow interval; unpaired drift does not cancel and widens it."""
    a, b = spec.per_token_s, plain.per_token_s
    n = len(a)
    if n != len(b):
        raise ValueError(f"{n} requests with the draft, {len(b)} without: not paired")
    if n == 0 or mean(b) <= 0:
        return float("nan"), float("nan")
    ma, mb = mean(a), mean(b)
    r = ma / mb
    if n < 2:
        return r, r
    va = sum((x - ma) ** 2 for x in a) / (n - 1)
    vb = sum((y - mb) ** 2 for y in b) / (n - 1)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1)
    var = (va - 2 * r * cov + r * r * vb) / (n * mb * mb)
    half = z * max(var, 0.0) ** 0.5
    return r - half, r + half


def _summary(name: str, values_s: list[float]) -> dict:
    """vLLM bench serve's keys for one metric: mean_/median_/std_/p90_/p99_{name}_ms."""
    if not values_s:
        return {}
    ms = sorted(1000 * v for v in values_s)

    def pct(p):  # linear interpolation between closest ranks (numpy's default)
        x = (len(ms) - 1) * p / 100
        lo = int(x)
        return ms[lo] + (ms[min(lo + 1, len(ms) - 1)] - ms[lo]) * (x - lo)
    return {f"mean_{name}_ms": mean(ms), f"median_{name}_ms": median(ms),
            f"std_{name}_ms": pstdev(ms), **{f"p{p}_{name}_ms": pct(p) for p in PERCENTILES}}


def latency_metrics(point: Point) -> dict:
    """One engine's run at one concurrency in vLLM `bench serve`'s names and definitions
    (eyas.engines.timing): TTFT, TPOT (requests of more than one token), ITL (every chunk gap
    of every request, pooled) and E2EL; throughputs over the summed wave time. An engine that
    reports no per-chunk times (the reference engine) has E2EL only."""
    t = point.timings
    out = {"completed": len(t), "total_output_tokens": point.tokens,
           "duration": point.wall_s,
           "request_throughput": len(t) / point.wall_s if point.wall_s > 0 else 0.0,
           "output_throughput": point.tokens_per_s}
    out |= _summary("ttft", [r.ttft_s for r in t if r.ttft_s is not None])
    out |= _summary("tpot", [r.tpot_s for r in t if r.tpot_s is not None])
    out |= _summary("itl", [gap for r in t for gap in r.itl_s])
    out |= _summary("e2el", [r.e2el_s for r in t])
    return out


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
            "ratio_interval": (list(ratio_interval(plain, spec))
                               if len(plain.timings) == len(spec.timings) else None),
            "lossless": spec.outputs == plain.outputs, "requests": len(spec.outputs),
            "with_draft": latency_metrics(spec), "without_draft": latency_metrics(plain),
            "spec_decode": spec_decode_metrics(acceptance) if acceptance else None}


def spec_decode_metrics(stats: AcceptanceStats) -> dict:
    """The speculative-decoding section of vLLM `bench serve`, its keys and definitions:
    acceptance rate in percent of draft tokens, acceptance length per verify step counting
    the target's own (bonus) token, per-position rates marginal (position i accepted, over
    all drafts; from 0). eyas adds the conditional rates (position i accepted given i-1 was)
    and the histogram of accepted drafts per step."""
    marginal = stats.per_position_rate
    return {"spec_decode_acceptance_rate": 100 * stats.acceptance_rate,
            "spec_decode_acceptance_length": stats.tau,
            "spec_decode_num_drafts": stats.drafts,
            "spec_decode_draft_tokens": stats.draft_tokens,
            "spec_decode_accepted_tokens": stats.accepted,
            "spec_decode_per_position_acceptance_rates": marginal,
            "conditional_acceptance_rates": stats.conditional_position_rate,
            "accepted_length_histogram": stats.accepted_lengths,
            "acceptance_length_interval_95": list(stats.tau_interval())}
