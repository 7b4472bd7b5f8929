"""A draft's normalisation options as evidence: was it trained with the options its config
says, which are the ones vLLM will apply?

For an eyas draft the options it was trained with are recorded (eyas_model_args) and held to
its config by the reader (eyas/draft/eagle3/formats/own.py). Another trainer's config is the
only record, and trainers have meant other things by the same key (SpecForge's `norm_output`
before its PR #879: a norm before lm_head only, with the pre-norm state fed back, which is
vLLM's `norm_output: false`); `norm_before_residual` is turned on by vLLM's speculators
converter when absent. Neither option has weights of its own, so the same weights can be
scored under either setting: the draft's log-likelihood of the target's token at draft
position 2 (the first step that reads what the draft fed back, which both options shape),
paired on the same tokens as the layout evidence is (eyas/doctor/evidence.py). A flipped
setting that fits better beyond doubt is a fault: the engine would serve another function.
"""
from __future__ import annotations

import dataclasses

from eyas.doctor.evidence import Comparison, compare, token_log_likelihoods
from eyas.doctor.findings import Finding
from eyas.draft.spec import ParallelDraft
from eyas.layout import HiddenStateLayout

FLIPPABLE = ("norm_output", "norm_before_residual")  # no weights of their own


def weigh_options(draft, probe, target_head, layout: HiddenStateLayout,
                  batch_size: int = 8) -> list[Comparison]:
    """The config's setting against each option flipped, at draft position 2 (z > 0: the
    config's setting fits better). A draft that reads no state it fed back (P-EAGLE, DFlash:
    `draft_steps`) has none to weigh."""
    if isinstance(draft, ParallelDraft):
        return []
    base = token_log_likelihoods(draft, probe, target_head, layout, batch_size, position=2)
    out = []
    for option in FLIPPABLE:
        flipped = not getattr(draft.config, option)
        other = type(draft)(dataclasses.replace(draft.config, **{option: flipped}),
                            draft.embed_tokens.weight, draft.vocab)
        other.load_state_dict(draft.state_dict())
        other = other.to(draft.fc.weight.dtype)
        ll = token_log_likelihoods(other, probe, target_head, layout, batch_size, position=2)
        out.append(compare(base, ll, layout.names, f"{option}={str(flipped).lower()}"))
    return out


def options_finding(comparisons: list[Comparison]) -> Finding | None:
    """"norm_options" when the weights fit a flipped option better beyond doubt."""
    beaten = [c for c in comparisons if c.settled == "candidate"]
    if not beaten:
        return None
    c = min(beaten, key=lambda c: c.mean_gap)
    option, value = c.kind.split("=")
    return Finding("norm_options", (
        f"the draft's weights fit {option}: {value} better than the {option}: "
        f"{'false' if value == 'true' else 'true'} its config says, which vLLM would apply "
        f"({-c.mean_gap:.3f} nats/token at draft position 2, paired z {c.z:+.1f}): it was "
        f"trained with {option}: {value} (SpecForge's norm_output meant a norm before lm_head "
        f"only before its PR #879); write \"{option}\": {value} in config.json"))
