"""P-EAGLE as a registered draft family (eyas.draft.families): EAGLE-3's sizes and norm
options (eyas.draft.eagle3.family), plus the layer count (draft.num_layers) and the mask token
(eyas.draft.vocab.choose_mask_token); served as `eagle3` with vLLM's parallel drafting.

Trained on its reference's objective (speculators' PEagleDraftModel, held to it on one batch
by tests/unit/test_peagle_objective.py): one mean over every scored (row, depth) of the batch
(pooled_loss), and a row of depth k >= 1 scored only where depths 1..k all predict counted
tokens (chained_rows), the rows speculators' COD sampling draws from. Unlike the reference,
eyas scores every such row instead of a random subsample per depth, and weighs depth k by
train.step_loss_decay**k where the reference keeps a depth's rows at the rate
max(down_sample_ratio**k, down_sample_ratio_min)."""
from __future__ import annotations

from eyas.conventions.vllm_checkpoint import NORM_OPTIONS
from eyas.draft.peagle import formats
from eyas.draft.peagle.checkpoint import save_draft
from eyas.draft.peagle.model import PEagleConfig, PEagleDraft
from eyas.conventions.kinds import KINDS
from eyas.draft.spec import Family, chain_rules, hyper_overrides
from eyas.draft.vocab import choose_mask_token


def new_draft(target_config, num_slots, vocab, embed, settings):
    overrides = hyper_overrides(settings)
    overrides.update({k: getattr(settings, k) for k in NORM_OPTIONS})
    overrides["num_layers"] = settings.num_layers or 1
    overrides["mask_token_id"] = choose_mask_token(
        target_config, getattr(embed, "weight", embed), vocab)
    config = PEagleConfig.from_target(target_config, num_slots, vocab.size, **overrides)
    return PEagleDraft(config, embed, vocab)


PEAGLE = Family("peagle", KINDS["peagle"], new_draft,
                lambda settings, train: train.ttt_steps, save_draft,
                {"method": "eagle3", "parallel_drafting": True}, formats,
                chain_rules, pooled_loss=True, chained_rows=True)
