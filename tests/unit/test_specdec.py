"""Greedy speculative decoding: the verify step, losslessness against plain greedy decoding,
and acceptance counters (measured tau next to the standalone prediction)."""
from __future__ import annotations

import pytest
import torch

from eyas.draft.eagle3.model import Eagle3Draft
from eyas.evaluate.measured import heldout_prompts, measure_tau
from eyas.draft.accuracy import evaluate_draft
from eyas.store.reader import ExtractedDataset
from eyas.engines.reference import generate_speculative, greedy_reference
from world import STEPS

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(trained_world, n=6):
    return heldout_prompts(ExtractedDataset(trained_world.data, "heldout"), n)


def test_prompts_end_where_the_assistant_starts(trained_world):
    ds = ExtractedDataset(trained_world.data, "heldout")
    prompts = _prompts(trained_world, 3)
    assert len(prompts) == 3
    for i, p in enumerate(prompts):
        mask = ds[i].loss_mask
        assert not mask[:len(p)].any() and mask[len(p)]
        assert ds[i].input_ids[:len(p)].tolist() == p


@pytest.mark.parametrize("k", [1, 3])
def test_output_equals_plain_greedy_decoding(trained_world, k):
    """Lossless with the trained draft (most drafts accepted) and with an untrained one (most
    rejected): both paths of verify_greedy are exercised."""
    torch.manual_seed(1)
    untrained = Eagle3Draft(trained_world.draft_config, trained_world.embed, trained_world.vocab).eval()
    for prompt in _prompts(trained_world, 3):
        plain = greedy_reference(trained_world.model, prompt, 12)
        hf_plain = trained_world.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                    pad_token_id=0)[0, len(prompt):].tolist()
        assert plain == hf_plain
        for draft in (trained_world.draft, untrained):
            out, stats = generate_speculative(trained_world.model, draft, trained_world.layout, prompt, k, 12)
            assert out == plain
            assert stats.drafts >= 1 and sum(stats.accepted_per_position) == stats.accepted
            assert all(a >= b for a, b in zip(stats.accepted_per_position,
                                               stats.accepted_per_position[1:]))
            # 1 token from prefill, n+1 per round; the last round may run past the limit
            assert 1 + stats.accepted + stats.drafts >= 12 > stats.accepted + stats.drafts - k


def test_eos_ends_generation(trained_world):
    prompt = _prompts(trained_world, 1)[0]
    plain = greedy_reference(trained_world.model, prompt, 12)
    eos = plain[4]
    out, stats = generate_speculative(trained_world.model, trained_world.draft, trained_world.layout, prompt, 3, 12,
                                      eos_token_id=eos)
    assert out == plain[:plain.index(eos) + 1]
    # it stopped at the round that emitted eos (even mid-chunk), not at max_new_tokens
    assert 1 + stats.accepted + stats.drafts <= len(out) + 3


def test_measured_tau_is_near_the_standalone_prediction(trained_world):
    """On this data the target's greedy answer is the data's (both follow the rule), so the
    teacher-forced prediction describes the real chain. 8 new tokens: every answer is at least
    that long; past its end the target writes things no training row covers."""
    measured = measure_tau(trained_world.model, trained_world.draft, trained_world.layout, _prompts(trained_world, 12), STEPS, 8)
    predicted = evaluate_draft(trained_world.draft, ExtractedDataset(trained_world.data, "heldout"), trained_world.head,
                               STEPS).predicted_tau
    assert measured.tau > 2.5, measured.to_dict()
    assert measured.tau == pytest.approx(predicted, abs=0.3), (measured.tau, predicted)
    untrained = Eagle3Draft(trained_world.draft_config, trained_world.embed, trained_world.vocab).eval()
    assert measure_tau(trained_world.model, untrained, trained_world.layout, _prompts(trained_world, 2), STEPS, 8).tau < 1.3


def test_bad_arguments_are_refused(trained_world):
    with pytest.raises(ValueError, match="k=0"):
        generate_speculative(trained_world.model, trained_world.draft, trained_world.layout, [1, 2], 0, 5)
    with pytest.raises(ValueError, match="non-empty"):
        generate_speculative(trained_world.model, trained_world.draft, trained_world.layout, [], 2, 5)
