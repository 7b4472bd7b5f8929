"""When a request's tokens arrived: what the serving latency metrics are computed from.

An engine step emits a chunk of a request's tokens (one token, or with speculative decoding the
accepted drafts plus the target's own). Measured from the request's submission:

    ttft   time to its first output token (prefill included)
    e2el   time to its last token (end-to-end latency)
    itl    the gaps between successive chunks (inter-token latency, per chunk as vLLM's
           `bench serve` counts it: a chunk of 3 accepted tokens is one gap)
    tpot   (e2el - ttft) / (output tokens - 1): time per output token after the first

E.g. a request submitted at 0 whose chunks of 1, 3 and 2 tokens arrive at 0.5, 0.7 and 0.8 s:
ttft 0.5, e2el 0.8, itl [0.2, 0.1], tpot 0.3 / 5 = 0.06.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestTiming:
    e2el_s: float
    output_tokens: int
    ttft_s: float | None = None  # None: the engine reports only when the request ended
    itl_s: tuple[float, ...] = ()

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    @classmethod
    def from_chunks(cls, submitted: float, chunks: list[tuple[float, int]]) -> "RequestTiming":
        """From (arrival time, tokens) per chunk, in order."""
        if not chunks:
            raise ValueError("a request with no output chunk has no timing")
        times = [t for t, _ in chunks]
        return cls(times[-1] - submitted, sum(n for _, n in chunks), times[0] - submitted,
                   tuple(b - a for a, b in zip(times, times[1:])))
