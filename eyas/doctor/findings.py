"""What the doctor, the gap alarm and parity report: findings with a name a program can test
and a message that names the fix, and how numbers are said in them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Finding:
    name: str  # a layout fault (candidates.LAYOUT_FINDINGS: missing_embedding | shifted |
    #            permuted | postnorm_verifier | other_slots) | target_mismatch | d2t_missing |
    #            d2t_identity | chat_template_changed | accuracy_gap | engine_feed |
    #            values_differ | layout_unknown (serve's preflight) | served_gap (a served
    #            speculation profile short of the offline one: eyas.doctor.profile)
    message: str


def accuracies(values: Sequence[float]) -> str:
    """[0.512, 0.431]: per-position accuracies as findings and verdicts say them."""
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"
