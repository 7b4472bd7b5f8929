"""The latency arithmetic of the serve stage (eyas/serve/latency.py): waves of requests, time
per output token, the speculative / plain ratio, losslessness per level."""
import pytest

from eyas.acceptance import AcceptanceStats
from eyas.serve.latency import compare, concurrency_levels, measure, waves


def engine(seconds_per_wave: float, tokens: int, accepted=None):
    """A deterministic generate(): each call takes `seconds_per_wave`, echoes the prompt's
    first token `tokens` times, and reports `accepted` rounds when it speculates."""
    calls = []

    def generate(wave, max_new_tokens):
        calls.append(len(wave))
        stats = (AcceptanceStats.from_rounds(accepted, 3) if accepted is not None else None)
        return [[p[0]] * tokens for p in wave], seconds_per_wave, stats
    return generate, calls


def test_levels_always_include_concurrency_one_and_refuse_zero():
    assert concurrency_levels([16, 4, 4]) == [1, 4, 16]
    assert concurrency_levels([]) == [1]
    with pytest.raises(ValueError, match="concurrency 0"):
        concurrency_levels([0, 4])


def test_prompts_run_in_waves_of_the_level():
    assert [len(w) for w in waves(list(range(8)), 3)] == [3, 3, 2]
    generate, calls = engine(0.5, 10)
    point = measure(generate, [[i] for i in range(8)], 10, 3)
    assert calls == [3, 3, 2] and point.tokens == 80
    assert point.time_per_token_s == pytest.approx(0.05)  # each request waits its wave: 0.5/10
    assert point.tokens_per_s == pytest.approx(80 / 1.5)


def test_ratio_is_speculative_over_plain_time_per_token():
    prompts = [[i] for i in range(4)]
    plain = measure(engine(1.0, 10)[0], prompts, 10, 1)
    spec = measure(engine(0.5, 10, accepted=[3, 1])[0], prompts, 10, 1)
    point = compare(plain, spec)
    assert point["ratio"] == pytest.approx(0.5) and point["lossless"]
    assert point["time_per_token_ms_plain"] == pytest.approx(100.0)
    assert point["tau"] == pytest.approx(spec.acceptance.tau)
    assert spec.acceptance.drafts == 8  # two rounds per wave, four waves: summed
    different = measure(lambda w, n: ([[7] * n for _ in w], 0.5, None), prompts, 10, 1)
    assert compare(plain, different)["lossless"] is False
