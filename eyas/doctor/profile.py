"""Speculation profiles: NVIDIA modelopt's `speculation_profile.json` (schema_version "1.0"),
the acceptance of a draft per position as serving simulators and schedulers read it, and the
alarm that compares the profile measured offline with the one measured while serving.

Where the format comes from: modelopt PR #2247 (NVIDIA/Model-Optimizer, with #2313, #2315 and
#2316; unmerged) writes it from `build_profile()` in
examples/specdec_bench/specdec_bench/speculation_profile.py. There is no published JSON Schema:
the format is the dict that function returns. `FIELDS` below is its field table, read from that
code, and `validate_profile` is eyas's check of it (extra keys are allowed; the keys added
within "1.0", `ADDED_WITHIN_1_0`, may be absent).

Definitions (draft positions 0-indexed; one verify step drafts K = num_speculative_tokens
tokens, accepts a in 0..K of them and emits a + 1 tokens, the target's bonus token included):
    marginal_accept_rates[i]     steps that accepted at least i+1 drafts / steps (vLLM's
                                 per-position rate: AcceptanceStats.accepted_per_position[i]
                                 / drafts); non-increasing
    conditional_accept_rates[i]  marginal[i] / marginal[i-1], marginal[-1] = 1 (0.0 when the
                                 denominator is 0): P(draft i+1 accepted | the first i were)
    acceptance_length_histogram  {str(a + 1): steps}: emitted lengths, bonus token included
    mean_accept_length           per-step mean emitted length = 1 + sum(marginal) = tau
    mean_accept_length_per_request  the mean over requests of each request's mean
Rates are rounded to 6 decimals. Worked example, K = 3, steps accepting [3, 0, 1, 2]:
histogram {"1": 1, "2": 1, "3": 1, "4": 1}, marginal [0.75, 0.5, 0.25], conditional
[0.75, 0.666667, 0.5], mean 1 + (3 + 0 + 1 + 2) / 4 = 2.5 = 1 + 0.75 + 0.5 + 0.25.

The gap alarm (`profile_gap`) compares the conditional rate at each position as two binomial
proportions: offline (eyas's reference engine) against served, on the same prompt set.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from eyas.acceptance import AcceptanceStats
from eyas.conversations.prompt_sets import HELDOUT
from eyas.doctor.findings import Finding
from eyas.files import write_json

SCHEMA_VERSION = "1.0"
PROFILE_FILE = "speculation_profile.json"
TOLERANCE = 0.02  # |1 + sum(marginal) - mean_accept_length| a consistent profile stays within
DIGITS = 6  # rates and means are rounded to this many decimals
ROUNDING = 2e-6  # what two 6-decimal roundings can move a rate or a product of rates
CHAIN_METHODS = {"eagle", "eagle1", "eagle2", "eagle3", "eagle3.1", "draft_model"}
MIN_TRIALS = 10  # positions with fewer steps reaching them on either side are not compared

# (key, kind, nullable), in the order build_profile emits them
FIELDS = (
    ("schema_version", "string", False),
    ("measured", "bool", False),
    ("method", "string", True),
    ("draft_checkpoint", "object", True),  # {"id": "org/name"}
    ("target_model", "object", True),
    ("num_speculative_tokens", "int", False),
    ("block_size", "int", True),
    ("max_supported_k", "int", True),
    ("verification_method", "string", False),  # "longest_prefix"
    ("conditional_accept_rates", "list", True),
    ("marginal_accept_rates", "list", True),
    ("vectors_unavailable_reason", "string", True),
    ("mean_accept_length", "number", True),
    ("mean_accept_length_per_request", "number", False),
    ("accept_length_model", "string", False),  # chain_analytic | measured_per_k
    ("accept_length_by_k", "object", False),  # {str(K): mean}
    ("acceptance_length_histogram", "object", True),
    ("per_category", "object", True),
    ("measurement_conditions", "object", True),  # dataset, concurrency, temperature, engine...
    ("validation", "object", True),  # mean_consistency, marginal_monotonicity
)
ADDED_WITHIN_1_0 = {"mean_accept_length_per_request", "vectors_unavailable_reason"}
VECTORS = ("marginal_accept_rates", "conditional_accept_rates")


class ProfileError(ValueError):
    """A speculation profile eyas cannot use; the message names the file or side and why."""


def profile_file(set_name: str) -> str:
    """speculation_profile.json for the held-out split, speculation_profile.SET.json else."""
    return PROFILE_FILE if set_name == HELDOUT else f"speculation_profile.{set_name}.json"


def _is(value, kind: str) -> bool:
    if kind in ("number", "int"):
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind == "number"
                                                      else int):
            return False
        return math.isfinite(value)
    return isinstance(value, {"string": str, "bool": bool, "object": dict, "list": list}[kind])


def _validation(marginal: list[float], mean: float) -> dict:
    implied = round(1 + sum(marginal), DIGITS)
    delta = round(abs(implied - mean), DIGITS)
    violations = [{"position": i, "value": m, "previous": marginal[i - 1]}
                  for i, m in enumerate(marginal) if i and m > marginal[i - 1]]
    return {"mean_consistency": {"implied_mean_accept_length": implied,
                                 "reported_mean_accept_length": mean, "abs_delta": delta,
                                 "tolerance": TOLERANCE, "passed": delta <= TOLERANCE},
            "marginal_monotonicity": {"passed": not violations, "violations": violations}}


def build_profile(stats: AcceptanceStats, *, method: str, draft_id: str, target_id: str,
                  num_speculative_tokens: int, producer: str, measurement_conditions: dict,
                  block_size: int | None = None, per_request_means: list[float] | None = None,
                  per_category: dict | None = None) -> dict:
    """The profile of these counters (every key of FIELDS, in order, then `producer`),
    validated. Without per-request means the per-step mean stands in for theirs."""
    k, steps = num_speculative_tokens, stats.drafts
    if steps == 0:
        raise ProfileError("no verify step was counted (nothing was drafted): a profile needs "
                           "at least one; decode more tokens per prompt")
    if len(stats.accepted_per_position) != k:
        raise ProfileError(f"counters of {len(stats.accepted_per_position)} positions for "
                           f"num_speculative_tokens={k}")
    marginal = [round(r, DIGITS) for r in stats.per_position_rate]
    conditional = [round(r, DIGITS) for r in stats.conditional_position_rate]
    mean = round(stats.tau, DIGITS)
    per_request = (round(sum(per_request_means) / len(per_request_means), DIGITS)
                   if per_request_means else mean)
    profile = {
        "schema_version": SCHEMA_VERSION, "measured": True, "method": method,
        "draft_checkpoint": {"id": draft_id}, "target_model": {"id": target_id},
        "num_speculative_tokens": k, "block_size": block_size, "max_supported_k": k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": conditional, "marginal_accept_rates": marginal,
        "vectors_unavailable_reason": None,
        "mean_accept_length": mean, "mean_accept_length_per_request": per_request,
        "accept_length_model": ("chain_analytic" if method.lower() in CHAIN_METHODS
                                else "measured_per_k"),
        "accept_length_by_k": {str(k): mean},
        "acceptance_length_histogram": {str(a + 1): n for a, n
                                        in enumerate(stats.accepted_lengths) if n},
        "per_category": per_category, "measurement_conditions": dict(measurement_conditions),
        "validation": _validation(marginal, mean),
        "producer": producer,
    }
    problems = validate_profile(profile)
    if problems:  # counters AcceptanceStats accepted cannot give these; say so if they do
        raise ProfileError("the built profile is invalid: " + "; ".join(problems))
    return profile


def _histogram_problems(histogram: dict, k: int) -> list[str]:
    problems = []
    for key, count in histogram.items():
        where = f"acceptance_length_histogram[{key!r}]"
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
            problems.append(f"{where}: a key is an emitted length, a string of an integer "
                            ">= 1 (the bonus token counts)")
        elif int(key) > k + 1:
            problems.append(f"{where}: a step drafting num_speculative_tokens={k} emits at "
                            f"most {k + 1} tokens")
        if not (_is(count, "int") and count >= 0):
            problems.append(f"{where}: count {count!r} is not an integer >= 0")
    return problems


def _accepted_counts(profile: dict) -> list[int]:
    """Steps that accepted 0..K drafts, from the histogram (lengths a + 1)."""
    counts = [0] * (profile["num_speculative_tokens"] + 1)
    for key, n in (profile.get("acceptance_length_histogram") or {}).items():
        counts[int(key) - 1] += n
    return counts


def _relation_problems(profile: dict) -> list[str]:
    """The rates against each other, the mean and the histogram."""
    problems = []
    marginal, conditional = profile["marginal_accept_rates"], profile["conditional_accept_rates"]
    if marginal is not None:
        for i in range(1, len(marginal)):
            if marginal[i] > marginal[i - 1]:
                problems.append(f"marginal_accept_rates[{i}]: {marginal[i]} above position "
                                f"{i - 1}'s {marginal[i - 1]} (a step accepting {i + 1} drafts "
                                f"accepted {i}: the marginals cannot increase)")
        mean = profile["mean_accept_length"]
        if mean is not None and abs(1 + sum(marginal) - mean) > TOLERANCE:
            problems.append(f"mean_accept_length: {mean} but 1 + sum(marginal_accept_rates) = "
                            f"{1 + sum(marginal):.6f} (more than {TOLERANCE} apart)")
        counts = _accepted_counts(profile)
        steps = sum(counts)
        for i, m in enumerate(marginal if steps else []):
            counted = sum(counts[i + 1:]) / steps
            if abs(counted - m) > ROUNDING:
                problems.append(f"marginal_accept_rates[{i}]: {m} but the histogram gives "
                                f"{counted:.6f}")
    if marginal is not None and conditional is not None:
        for i, c in enumerate(conditional):
            previous = marginal[i - 1] if i else 1.0
            if (abs(c * previous - marginal[i]) > ROUNDING if previous else c != 0.0):
                problems.append(f"conditional_accept_rates[{i}]: {c} but marginal[{i}] / "
                                f"marginal[{i - 1}] = {marginal[i]} / {previous}")
    return problems


def validate_profile(profile) -> list[str]:
    """What is wrong with a profile, each problem naming the key and the value; [] if valid."""
    if not isinstance(profile, dict):
        return [f"the profile is a JSON {type(profile).__name__}, not an object"]
    problems = []
    for key, kind, nullable in FIELDS:
        if key not in profile:
            if key not in ADDED_WITHIN_1_0:
                problems.append(f"{key}: missing")
        elif not (_is(profile[key], kind) or (nullable and profile[key] is None)):
            problems.append(f"{key}: {profile[key]!r} is not a {kind}"
                            + (" or null" if nullable else ""))
    if problems:  # the checks below read these keys
        return problems
    if profile["schema_version"] != SCHEMA_VERSION:
        problems.append(f"schema_version: {profile['schema_version']!r}; eyas reads "
                        f"{SCHEMA_VERSION!r}")
    k = profile["num_speculative_tokens"]
    if k < 1:
        return problems + [f"num_speculative_tokens: {k} is not >= 1"]
    for key in VECTORS:
        rates = profile[key]
        if rates is not None and len(rates) != k:
            problems.append(f"{key}: {len(rates)} rates for num_speculative_tokens={k}")
        for i, rate in enumerate(rates or []):
            if not (_is(rate, "number") and 0 <= rate <= 1):
                problems.append(f"{key}[{i}]: {rate!r} is not a rate in [0, 1]")
    problems += _histogram_problems(profile["acceptance_length_histogram"] or {}, k)
    for key, mean in profile["accept_length_by_k"].items():
        if not (str(key).isdigit() and _is(mean, "number")):
            problems.append(f"accept_length_by_k[{key!r}]: {mean!r} is not a mean under a "
                            "string K")
    return problems or _relation_problems(profile)


def stats_from_profile(profile: dict) -> AcceptanceStats:
    """The counters its histogram holds (drafts, accepted, per position)."""
    problems = validate_profile(profile)
    if problems:
        raise ProfileError("; ".join(problems))
    if not profile["acceptance_length_histogram"]:
        raise ProfileError("acceptance_length_histogram: empty or null, so the profile holds "
                           "no counts (only rates)")
    counts = _accepted_counts(profile)
    k, steps = profile["num_speculative_tokens"], sum(counts)
    return AcceptanceStats(steps, k * steps, sum(a * n for a, n in enumerate(counts)),
                           tuple(sum(counts[i + 1:]) for i in range(k)))


def read_profile(path: str | Path) -> dict:
    """A profile file, validated; ProfileError naming the file and every problem."""
    p = Path(path)
    try:
        profile = json.loads(p.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{p}: no such file") from None
    except ValueError as e:
        raise ProfileError(f"{p}: not valid JSON ({e})") from None
    problems = validate_profile(profile)
    if problems:
        raise ProfileError(f"{p}: not a speculation profile (modelopt schema "
                           f"{SCHEMA_VERSION}): " + "; ".join(problems)
                           + ". Measure it again (eyas's evaluate stage writes one) or fix "
                           "those keys")
    return profile


def write_profile(path: str | Path, profile: dict) -> Path:
    problems = validate_profile(profile)
    if problems:
        raise ProfileError(f"{path}: refusing to write an invalid profile: "
                           + "; ".join(problems))
    write_json(path, profile)
    return Path(path)


def _chain(profile: dict, side: str) -> list[tuple[int, int]]:
    """Per position i: (steps that accepted >= i drafts, those that accepted >= i + 1)."""
    problems = validate_profile(profile)
    if not problems and not profile["acceptance_length_histogram"]:
        problems = ["acceptance_length_histogram is empty or null (the alarm needs counts)"]
    if problems:
        raise ProfileError(f"the {side} profile: " + "; ".join(problems))
    counts = _accepted_counts(profile)
    reached = [sum(counts[a:]) for a in range(len(counts))]
    return list(zip(reached, reached[1:]))


def profile_gap(offline: dict, served: dict, z: float = 3.0,
                set_name: str = HELDOUT) -> Finding | None:
    """A `served_gap` finding when the served conditional acceptance falls short of the
    offline one by more than z standard errors at some position (one-sided; pooled binomial
    standard error; positions where a side has fewer than MIN_TRIALS steps are skipped)."""
    short = []
    for i, ((n_off, s_off), (n_srv, s_srv)) in enumerate(zip(_chain(offline, "offline"),
                                                             _chain(served, "served"))):
        if min(n_off, n_srv) < MIN_TRIALS:
            continue
        pooled = (s_off + s_srv) / (n_off + n_srv)
        se = math.sqrt(pooled * (1 - pooled) * (1 / n_off + 1 / n_srv))
        score = (s_srv / n_srv - s_off / n_off) / se if se else 0.0
        if score < -z:
            short.append(f"position {i + 1}: served {s_srv / n_srv:.2f} of {n_srv} vs "
                         f"offline {s_off / n_off:.2f} of {n_off}, z {score:.1f}")
    if not short:
        return None
    return Finding("served_gap", (
        f"prompt set {set_name!r}: the served draft accepts less than eyas's reference engine "
        f"measured on the same prompts (conditional acceptance, more than {z:g} standard "
        f"errors short): {'; '.join(short)}. The serving engine feeds or verifies the draft "
        "differently from the reference engine: e.g. other hidden states (another layer's, or "
        "read before or after a norm), another chat template or tokenization of the prompts, "
        "a different sampling setting (temperature above 0). Run `eyas doctor` with the "
        "engine (engine=vllm:VERSION: which tensors it feeds the draft) and the serve stage's "
        "parity check to find which"))


def profile_gaps(offline_by_set: dict, served_by_set: dict,
                 z: float = 3.0) -> list[Finding]:
    """profile_gap over the sets both sides measured, the held-out split first."""
    names = sorted(set(offline_by_set) & set(served_by_set), key=lambda s: (s != HELDOUT, s))
    found = (profile_gap(offline_by_set[s], served_by_set[s], z, s) for s in names)
    return [f for f in found if f is not None]
