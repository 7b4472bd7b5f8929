"""Speculation profiles (modelopt's speculation_profile.json): the numbers build_profile writes,
the validator against each kind of damage, the round trip to counters, and the gap alarm
between the offline and the served profile."""
import copy
import json
import random

import pytest

from eyas.acceptance import AcceptanceStats
from eyas.doctor.profile import (FIELDS, ProfileError, build_profile, profile_file,
                                 profile_gap, profile_gaps, read_profile, stats_from_profile,
                                 validate_profile, write_profile)


def _profile(accepted_per_step, k=3, method="eagle3", **kw):
    return build_profile(AcceptanceStats.from_rounds(accepted_per_step, k), method=method,
                         draft_id="org/draft", target_id="org/target",
                         num_speculative_tokens=k, producer="test",
                         measurement_conditions={"dataset": "heldout"}, **kw)


def _counts(per_accepted: list[int], k=3):
    """A profile of steps accepting a drafts per_accepted[a] times each."""
    return _profile([a for a, n in enumerate(per_accepted) for _ in range(n)], k)


def test_build_profile_on_counts_worked_by_hand():
    p = _profile([3, 0, 1, 2], per_request_means=[2.0, 3.5])
    # 4 steps: accepted >= 1 by 3 of them, >= 2 by 2, >= 3 by 1
    assert p["marginal_accept_rates"] == [0.75, 0.5, 0.25]
    assert p["conditional_accept_rates"] == [0.75, 0.666667, 0.5]  # 3/4, 2/3, 1/2
    assert p["acceptance_length_histogram"] == {"1": 1, "2": 1, "3": 1, "4": 1}
    assert p["mean_accept_length"] == 2.5  # (4 + 1 + 2 + 3) / 4 emitted per step
    assert p["mean_accept_length_per_request"] == 2.75  # (2.0 + 3.5) / 2
    assert p["accept_length_by_k"] == {"3": 2.5}
    assert p["validation"]["mean_consistency"]["implied_mean_accept_length"] == 2.5
    assert p["validation"]["mean_consistency"]["passed"] is True
    assert list(p) == [key for key, _, _ in FIELDS] + ["producer"]
    assert (p["schema_version"], p["verification_method"], p["max_supported_k"]) == (
        "1.0", "longest_prefix", 3)
    assert p["accept_length_model"] == "chain_analytic"
    assert _profile([1, 0], method="dflash")["accept_length_model"] == "measured_per_k"
    with pytest.raises(ProfileError, match="no verify step"):
        _profile([])


def test_a_profile_as_modelopt_writes_it_reads():
    """modelopt's test histogram {1: 40, 2: 30, 3: 30} at K = 3 (research notes: marginal
    [0.6, 0.3, 0.0], conditional [0.6, 0.5, 0.0], mean 1.9), without the keys added later."""
    p = json.loads(json.dumps(_counts([40, 30, 30, 0])))
    del p["producer"], p["vectors_unavailable_reason"]
    assert validate_profile(p) == []
    assert (p["marginal_accept_rates"], p["conditional_accept_rates"]) == (
        [0.6, 0.3, 0.0], [0.6, 0.5, 0.0])
    stats = stats_from_profile(p)
    assert (stats.drafts, stats.accepted, stats.accepted_per_position) == (100, 90, (60, 30, 0))
    assert stats.tau == pytest.approx(1.9)


def _damage(profile, key, value=None, delete=False):
    p = copy.deepcopy(profile)
    if delete:
        del p[key]
    else:
        p[key] = value
    return p


@pytest.mark.parametrize("damage,problem", [
    (lambda p: _damage(p, "marginal_accept_rates", delete=True),
     "marginal_accept_rates: missing"),
    (lambda p: _damage(p, "conditional_accept_rates", [1.2, 0.666667, 0.5]),
     "conditional_accept_rates[0]: 1.2 is not a rate in [0, 1]"),
    (lambda p: _damage(p, "marginal_accept_rates", [0.5, 0.75, 0.25]),
     "marginal_accept_rates[1]: 0.75 above position 0's 0.5"),
    (lambda p: _damage(p, "acceptance_length_histogram", {"0": 1, "2": 1, "3": 1, "4": 1}),
     "acceptance_length_histogram['0']: a key is an emitted length"),
    (lambda p: _damage(p, "mean_accept_length", 2.9),
     "mean_accept_length: 2.9 but 1 + sum(marginal_accept_rates) = 2.500000"),
    (lambda p: _damage(p, "conditional_accept_rates", [0.75, 0.5, 0.5]),
     "conditional_accept_rates[1]: 0.5 but marginal[1] / marginal[0] = 0.5 / 0.75"),
    (lambda p: _damage(p, "marginal_accept_rates", [0.75, 0.5]),
     "marginal_accept_rates: 2 rates for num_speculative_tokens=3"),
    (lambda p: _damage(p, "acceptance_length_histogram", {"1": 2, "2": 1, "4": 1}),
     "marginal_accept_rates[1]: 0.5 but the histogram gives 0.250000"),
    (lambda p: _damage(p, "measured", 1), "measured: 1 is not a bool"),
])
def test_validator_catches_each_damage(damage, problem):
    good = json.loads(json.dumps(_profile([3, 0, 1, 2])))
    assert validate_profile(good) == []
    problems = validate_profile(damage(good))
    assert any(problem in p for p in problems), problems


def test_counters_round_trip_through_a_file(tmp_path):
    stats = AcceptanceStats.from_rounds([3, 0, 1, 2, 2, 0, 0, 3], 3)
    p = _profile([3, 0, 1, 2, 2, 0, 0, 3])
    path = write_profile(tmp_path / profile_file("heldout"), p)
    assert path.name == "speculation_profile.json"
    assert profile_file("code") == "speculation_profile.code.json"
    assert stats_from_profile(read_profile(path)) == stats
    broken = _damage(p, "marginal_accept_rates", [0.5, 0.75, 0.25])
    (tmp_path / "bad.json").write_text(json.dumps(broken))
    with pytest.raises(ProfileError, match=r"bad.json: not a speculation profile.*"
                                           r"marginal_accept_rates\[1\]: 0.75"):
        read_profile(tmp_path / "bad.json")
    with pytest.raises(ProfileError, match="marginal_accept_rates"):
        write_profile(tmp_path / "never.json", broken)
    assert not (tmp_path / "never.json").exists()


# the chain of the gap tests: 1000 steps with conditional rates [0.7, 0.6, 0.5] exactly,
# i.e. 700 reach position 2, 420 position 3, 210 accept all three
OFFLINE = [300, 280, 210, 210]


def test_gap_names_the_short_position_and_only_it():
    # position 2's successes cut by a third (420 -> 280), position 3's rate kept at 0.5
    served = _counts([300, 420, 140, 140])
    finding = profile_gap(_counts(OFFLINE), served, set_name="chat")
    assert finding is not None and finding.name == "served_gap"
    # by hand: 0.40 vs 0.60 of 700 each; pooled 0.5, se sqrt(0.25 * 2 / 700) = 0.0267
    assert "position 2: served 0.40 of 700 vs offline 0.60 of 700, z -7.5" in finding.message
    assert "position 1:" not in finding.message and "position 3:" not in finding.message
    assert "'chat'" in finding.message and "eyas doctor" in finding.message
    assert "chat template" in finding.message and "parity" in finding.message
    assert profile_gap(served, _counts(OFFLINE)) is None  # one-sided: served better is fine


def test_gap_skips_positions_few_steps_reach():
    never = [9, 0, 0, 0]  # 9 served steps, all rejected at position 1
    assert profile_gap(_counts(OFFLINE), _counts(never)) is None
    finding = profile_gap(_counts(OFFLINE), _counts([30, 0, 0, 0]))
    assert finding is not None and "position 1: served 0.00 of 30" in finding.message


def _sampled(seed: int, steps: int = 400, rates=(0.7, 0.6, 0.5)):
    rng = random.Random(seed)
    accepted = []
    for _ in range(steps):
        a = 0
        while a < len(rates) and rng.random() < rates[a]:
            a += 1
        accepted.append(a)
    return _profile(accepted)


def test_gap_is_quiet_between_samples_of_one_process():
    pairs = [(_sampled(2 * s), _sampled(2 * s + 1)) for s in range(10)]
    assert [profile_gap(a, b) for a, b in pairs] == [None] * 10
    # the same samples at a hair-trigger threshold do differ: quiet above is the threshold's
    assert any(profile_gap(a, b, z=0.5) for a, b in pairs)


def test_gaps_over_the_sets_both_sides_measured():
    short = _counts([300, 420, 140, 140])
    found = profile_gaps({"heldout": _counts(OFFLINE), "code": _counts(OFFLINE),
                          "chat": _counts(OFFLINE)},
                         {"code": short, "heldout": short, "other": short})
    assert ["'heldout'" in found[0].message, "'code'" in found[1].message] == [True, True]
    assert len(found) == 2
    with pytest.raises(ProfileError, match="the served profile: measured: missing"):
        profile_gap(_counts(OFFLINE), _damage(short, "measured", delete=True))
