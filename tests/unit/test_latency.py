"""The latency arithmetic of the serve stage (eyas/serve/latency.py): waves of requests, time
per output token, the speculative / plain ratio, losslessness per level, chats replayed turn by
turn, and vLLM bench serve's metrics under its names and definitions."""
import pytest

from eyas.acceptance import AcceptanceStats
from eyas.conversations.prompt_sets import Conversation
from eyas.engines.timing import RequestTiming
from eyas.serve.latency import (compare, concurrency_levels, latency_metrics, measure,
                                measure_interleaved, ratio_interval, spec_decode_metrics, waves)


def engine(seconds_per_wave: float, tokens: int, accepted=None, timed=False):
    """A deterministic generate(): each call takes `seconds_per_wave`, echoes the prompt's
    first token `tokens` times, and reports `accepted` rounds when it speculates; `timed`:
    each request's tokens arrive in two chunks, the first at a tenth of the wave."""
    calls = []

    def generate(wave, max_new_tokens):
        calls.append([list(p) for p in wave])
        stats = (AcceptanceStats.from_rounds(accepted, 3) if accepted is not None else None)
        timings = ([RequestTiming.from_chunks(0.0, [(seconds_per_wave / 10, 1),
                                                    (seconds_per_wave, tokens - 1)])
                    for _ in wave] if timed else None)
        return [[p[0]] * tokens for p in wave], seconds_per_wave, stats, timings
    return generate, calls


def prompts(n):
    return [Conversation(prompt_ids=(i,)) for i in range(n)]


def test_levels_always_include_concurrency_one_and_refuse_zero():
    assert concurrency_levels([16, 4, 4]) == [1, 4, 16]
    assert concurrency_levels([]) == [1]
    with pytest.raises(ValueError, match="concurrency 0"):
        concurrency_levels([0, 4])


def test_prompts_run_in_waves_of_the_level():
    assert [len(w) for w in waves(list(range(8)), 3)] == [3, 3, 2]
    generate, calls = engine(0.5, 10)
    point = measure(generate, prompts(8), 10, 3)
    assert [len(c) for c in calls] == [3, 3, 2] and point.tokens == 80
    assert point.time_per_token_s == pytest.approx(0.05)  # each request waits its wave: 0.5/10
    assert point.tokens_per_s == pytest.approx(80 / 1.5)


def test_ratio_is_speculative_over_plain_time_per_token():
    plain = measure(engine(1.0, 10)[0], prompts(4), 10, 1)
    spec = measure(engine(0.5, 10, accepted=[3, 1])[0], prompts(4), 10, 1)
    point = compare(plain, spec)
    assert point["ratio"] == pytest.approx(0.5) and point["lossless"]
    assert point["time_per_token_ms_plain"] == pytest.approx(100.0)
    assert point["tau"] == pytest.approx(spec.acceptance.tau)
    assert spec.acceptance.drafts == 8  # two rounds per wave, four waves: summed
    different = measure(lambda w, n: ([[7] * n for _ in w], 0.5, None, None), prompts(4), 10, 1)
    assert compare(plain, different)["lossless"] is False


def test_a_chat_is_replayed_turn_by_turn_with_the_answers_it_got():
    """Turn 2's prompt is the rendering of [user 1, the engine's answer 1, user 2]; a chat
    with fewer turns leaves its wave when it is done."""
    def render(messages):
        return [len(m["content"]) if m["role"] != "assistant" else 900 + len(m["content"])
                for m in messages]
    chats = [Conversation(turns=("hi", "more please")), Conversation(turns=("abc",))]
    generate, calls = engine(1.0, 3)
    point = measure(generate, chats, 3, 2, render, decode=lambda ids: "a" * len(ids))
    # wave 1: both chats' first turns together; then chat 0 alone, after its answer (3 tokens)
    assert calls == [[[2], [3]], [[2, 903, 11]]]
    assert len(point.outputs) == 3  # three requests


def test_latency_metrics_carry_vllm_bench_serve_names_and_definitions():
    # chunks of 1 and 3 tokens at 0.5 and 0.8 s, then 2 at 1.0 s: the docstring's example shape
    a = RequestTiming.from_chunks(0.0, [(0.5, 1), (0.8, 3), (1.0, 2)])
    assert (a.ttft_s, a.e2el_s, a.output_tokens) == (0.5, 1.0, 6)
    assert a.itl_s == pytest.approx((0.3, 0.2))
    assert a.tpot_s == pytest.approx(0.5 / 5)  # after the first token: (e2el - ttft) / 5
    b = RequestTiming.from_chunks(0.0, [(0.1, 4)])  # one chunk: no gap, TPOT from 3 tokens
    from eyas.serve.latency import Point
    point = Point(1, outputs=[[0] * 6, [0] * 4], wall_s=2.0, timings=[a, b])
    m = latency_metrics(point)
    assert m["mean_ttft_ms"] == pytest.approx(300.0) and m["median_ttft_ms"] == pytest.approx(300.0)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 400 * 0.99)  # interpolated, as numpy does
    assert m["mean_tpot_ms"] == pytest.approx((100 + 0) / 2)
    assert m["mean_itl_ms"] == pytest.approx(250.0)  # gaps of all requests pooled: 300, 200
    assert m["p90_e2el_ms"] == pytest.approx(100 + 900 * 0.9)
    assert m["output_throughput"] == pytest.approx(10 / 2.0)
    assert m["request_throughput"] == pytest.approx(1.0) and m["completed"] == 2


def test_an_engine_without_chunk_times_reports_end_to_end_only():
    point = measure(engine(0.5, 10)[0], prompts(2), 10, 1)
    m = latency_metrics(point)
    assert "mean_e2el_ms" in m and not any(k.endswith(("_ttft_ms", "_itl_ms", "_tpot_ms"))
                                           for k in m)
    timed = latency_metrics(measure(engine(0.5, 10, timed=True)[0], prompts(2), 10, 1))
    assert timed["mean_ttft_ms"] == pytest.approx(50.0)


def test_spec_decode_metrics_are_vllms_marginals_with_the_conditionals_beside():
    # steps accepting 3, 0, 1, 2 of k=3: position i accepted in [3, 2, 1] of 4 steps
    m = spec_decode_metrics(AcceptanceStats.from_rounds([3, 0, 1, 2], 3))
    assert m["spec_decode_acceptance_length"] == pytest.approx(1 + 6 / 4)
    assert m["spec_decode_acceptance_rate"] == pytest.approx(100 * 6 / 12)
    assert m["spec_decode_per_position_acceptance_rates"] == pytest.approx([0.75, 0.5, 0.25])
    assert m["conditional_acceptance_rates"] == pytest.approx([0.75, 2 / 3, 0.5])
    assert m["accepted_length_histogram"] == [1, 1, 1, 1]
    assert (m["spec_decode_num_drafts"], m["spec_decode_draft_tokens"],
            m["spec_decode_accepted_tokens"]) == (4, 12, 6)


def _drifting(clock: list, per_token: float, tokens: int = 10, accepted=None):
    """A generate() on a machine that slows down: each call takes per_token * tokens times
    the machine's current slowness (clock[0], grown by 10 % at every call of either side)."""
    calls = []

    def generate(wave, max_new_tokens):
        calls.append(wave[0][0])
        clock[0] *= 1.1
        wall = per_token * tokens * clock[0]
        stats = AcceptanceStats.from_rounds(accepted, 3) if accepted is not None else None
        return [[p[0]] * tokens for p in wave], wall, stats, None
    return generate, calls


def test_interleaved_sides_alternate_and_cancel_a_drifting_machine():
    clock = [1.0]
    plain, plain_calls = _drifting(clock, 0.02)
    spec, spec_calls = _drifting(clock, 0.01, accepted=[3, 1])
    a, b = measure_interleaved(plain, spec, prompts(8), 10)
    # every conversation served by both sides, the first side alternating A/B/B/A
    assert plain_calls == spec_calls == list(range(8))
    assert len(a.timings) == len(b.timings) == 8 and b.acceptance.drafts == 16
    low, high = ratio_interval(a, b)
    truth = 0.5  # half the time per token, whatever the machine's speed
    assert low <= truth <= high and high - low < 0.12
    # one side after the other on the same drifting machine: the ratio is off by the drift
    clock[0] = 1.0
    after_plain = measure(_drifting(clock, 0.02)[0], prompts(8), 10, 1)
    after_spec = measure(_drifting(clock, 0.01, accepted=[3, 1])[0], prompts(8), 10, 1)
    assert compare(after_plain, after_spec)["ratio"] > 1.0
    assert compare(a, b)["ratio"] == pytest.approx(truth, rel=0.1)


def test_the_ratio_interval_needs_paired_requests():
    plain = measure(engine(1.0, 10)[0], prompts(4), 10, 1)
    spec = measure(engine(0.5, 10)[0], prompts(3), 10, 1)
    with pytest.raises(ValueError, match="not paired"):
        ratio_interval(plain, spec)
    assert compare(plain, spec)["ratio_interval"] is None
