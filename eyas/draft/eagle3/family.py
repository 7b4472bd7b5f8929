"""EAGLE-3 and EAGLE 3.1 as draft families (eyas.draft.families): the model of model.py, the
training-time test of ttt.py, the writer of checkpoint.py; EAGLE 3.1 is the same draft with
its defining normalisation options (families.EAGLE31_OPTIONS) over the run's."""
from __future__ import annotations

from eyas.conventions.vllm_checkpoint import NORM_OPTIONS
from eyas.draft.eagle3.checkpoint import save_draft
from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
from eyas.draft.families import EAGLE31_OPTIONS, Family


def hyper_overrides(settings) -> dict:
    """The draft.* sizes that override the target's (null: the target's)."""
    return {k: v for k, v in (("hidden_size", settings.hidden_size),
                              ("num_attention_heads", settings.num_heads),
                              ("intermediate_size", settings.intermediate_size)) if v}


def family(name: str) -> Family:
    options = EAGLE31_OPTIONS if name == "eagle3.1" else {}

    def new_draft(target_config, num_slots, vocab, embed, settings):
        overrides = hyper_overrides(settings)
        overrides.update({k: getattr(settings, k) for k in NORM_OPTIONS})
        overrides.update(options)
        config = Eagle3Config.from_target(target_config, num_slots, vocab.size, **overrides)
        return Eagle3Draft(config, embed, vocab)

    def save(draft, layout, vocab, out_dir, extra=None):
        return save_draft(draft, layout, vocab, out_dir, extra, family=name)

    return Family(name, new_draft, lambda settings, train: train.ttt_steps, save,
                  lambda: {"method": "eagle3"})
