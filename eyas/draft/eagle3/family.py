"""EAGLE-3 and EAGLE 3.1 as registered draft families (eyas.draft.families): the model of
model.py, the readers of formats/, eyas/draft's training-time test and writer; EAGLE 3.1 is
the same draft with its defining normalisation options (fc_norm and norm_output on,
norm_before_fc off) over the run's."""
from __future__ import annotations

from eyas.conventions.vllm_checkpoint import NORM_OPTIONS
from eyas.draft.eagle3 import formats
from eyas.draft.checkpoint import EAGLE3_WRITES, save_draft
from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
from eyas.conventions.kinds import KINDS
from eyas.draft.spec import Family, chain_rules, hyper_overrides

# the options that define EAGLE 3.1, applied over draft.* (eyas.config.DraftConfig)
EAGLE31_OPTIONS = {"fc_norm": True, "norm_output": True, "norm_before_fc": False}


def _family(name: str, options: dict) -> Family:
    def new_draft(target_config, num_slots, vocab, embed, settings):
        overrides = hyper_overrides(settings)
        overrides.update({k: getattr(settings, k) for k in NORM_OPTIONS})
        overrides.update(options)
        config = Eagle3Config.from_target(target_config, num_slots, vocab.size, **overrides)
        return Eagle3Draft(config, embed, vocab)

    def save(draft, layout, vocab, out_dir, extra=None):
        return save_draft(draft, layout, vocab, out_dir, extra,
                          writes=EAGLE3_WRITES._replace(family=name))

    return Family(name, KINDS[name], new_draft, lambda settings, train: train.ttt_steps, save,
                  {"method": "eagle3"}, formats, chain_rules, max_layers=1)


EAGLE3 = _family("eagle3", {})
EAGLE31 = _family("eagle3.1", EAGLE31_OPTIONS)
