"""Acceptance counted in one place: the greedy verify step, the engines' counters (from
verify rounds, from vLLM's metrics), and a chain simulated as an engine steps it."""
from types import SimpleNamespace

import pytest
import torch

from eyas.acceptance import AcceptanceStats, verify_greedy
from helpers import simulate_chain


@pytest.mark.parametrize("draft,target,n,emitted", [
    ([5, 7, 9], [5, 7, 9, 4], 3, [5, 7, 9, 4]),  # all accepted, plus the bonus token
    ([5, 7, 9], [5, 7, 2, 4], 2, [5, 7, 2]),  # rejected at 3: the target's token instead
    ([5, 7, 9], [1, 7, 9, 4], 0, [1]),  # later agreement counts for nothing after a miss
    ([3], [3, 8], 1, [3, 8]),
])
def test_verify_greedy_accepts_the_agreeing_prefix(draft, target, n, emitted):
    got_n, got = verify_greedy(torch.tensor(draft), torch.tensor(target))
    assert got_n == n and got.tolist() == emitted


def test_verify_greedy_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="3 draft tokens need 4 target tokens, got 3"):
        verify_greedy(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]))


def test_stats_count_like_engines():
    stats = AcceptanceStats.from_rounds([3, 0, 1], k=3)  # the module docstring's example
    assert (stats.drafts, stats.draft_tokens, stats.accepted) == (3, 9, 4)
    assert stats.accepted_per_position == (2, 1, 1)
    assert stats.tau == pytest.approx(1 + 4 / 3)
    both = stats + AcceptanceStats.from_rounds([2], k=3)
    assert (both.drafts, both.accepted, both.accepted_per_position) == (4, 6, (3, 2, 1))
    assert AcceptanceStats.from_rounds([], k=2).tau == 1.0



def test_spec_decode_counters_sum_label_sets():
    metric = lambda name, **kw: SimpleNamespace(name=name, labels={}, **kw)  # noqa: E731
    metrics = [metric("vllm:spec_decode_num_drafts", value=3),
               metric("vllm:spec_decode_num_drafts", value=2),
               metric("vllm:spec_decode_num_draft_tokens", value=15),
               metric("vllm:spec_decode_num_accepted_tokens", value=7),
               metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=[4, 2, 1]),
               metric("vllm:num_requests_running", value=9)]
    assert AcceptanceStats.from_vllm_metrics(metrics) == AcceptanceStats(5, 15, 7, (4, 2, 1))
    assert AcceptanceStats.from_vllm_metrics([]) == AcceptanceStats()


def test_acceptance_worked_example():
    # k = 3, verify steps accepting [3, 0, 1]
    stats = AcceptanceStats(3, 9, 4, (2, 1, 1))
    assert stats.tau == pytest.approx(1 + 4 / 3)
    assert stats.per_position_rate == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert stats.minus(AcceptanceStats(1, 3, 3, (1, 1, 1))) == AcceptanceStats(2, 6, 1, (1, 0, 0))
    assert AcceptanceStats().tau == 1.0
    with pytest.raises(ValueError, match="outside 0..draft_tokens"):
        AcceptanceStats(1, 3, 4, ())
    with pytest.raises(ValueError, match="non-increasing"):
        AcceptanceStats(3, 9, 4, (1, 2, 1))


def test_simulate_chain_counts_steps_as_an_engine_does():
    out = [7, 7, 7, 7, 5, 5, 1, 2, 3, 3]  # greedy tokens, first from prefill
    repeat_last = lambda r, pos: [out[pos - 1]] * 2  # noqa: E731
    # committed 1: propose [7, 7] vs [7, 7] -> a=2, commit 3 (pos 4)
    # pos 4: propose [7, 7] vs [5, 5] -> a=0 (pos 5); pos 5: [5, 5] vs [5, 1] -> a=1 (pos 7)
    stats = simulate_chain([out], repeat_last, k=2, max_new_tokens=7)
    assert stats == AcceptanceStats(3, 6, 3, (2, 1))
    with pytest.raises(ValueError, match="needs max_new_tokens \\+ k"):
        simulate_chain([out[:8]], repeat_last, k=2, max_new_tokens=7)


def test_tau_interval_comes_from_the_accepted_lengths():
    """Steps accepting [3, 0, 1]: lengths histogram [1, 1, 0, 1], tau 7/3, sample sd of
    [3, 0, 1] = sqrt(7/3), half-width 1.96 * sd / sqrt(3). The same tau from steps that all
    accept alike has no spread: its interval is a point."""
    stats = AcceptanceStats.from_rounds([3, 0, 1], 3)
    assert stats.accepted_lengths == [1, 1, 0, 1]
    low, high = stats.tau_interval()
    half = 1.96 * (7 / 3) ** 0.5 / 3 ** 0.5
    assert abs(low - (7 / 3 - half)) < 1e-12 and abs(high - (7 / 3 + half)) < 1e-12
    steady = AcceptanceStats.from_rounds([1, 2, 1, 2, 1, 2], 3)
    assert steady.accepted_lengths == [0, 3, 3, 0]
    assert steady.tau_interval()[1] - steady.tau_interval()[0] < high - low
    alike = AcceptanceStats.from_rounds([2, 2, 2], 3)
    assert alike.tau_interval() == (3.0, 3.0)
    assert stats.to_dict()["tau_interval"] == [low, high]
