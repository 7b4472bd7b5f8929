"""The draft families eyas trains (`draft.family`), all from the same extraction: the layout
names the slots once, and each family's writer compiles them into its own config key with its
own shift.

    eagle3     chain EAGLE-3 (eyas/draft/eagle3/): one step per drafted token
    eagle3.1   EAGLE-3 with one RMSNorm per aux slot before fc and the post-norm state fed
               back (fc_norm, norm_output; norm_before_fc off): the same model and writer
    peagle     P-EAGLE (eyas/draft/peagle/): EAGLE-3's layer, every draft of a step in one
               pass, the later positions fed a learned `mask_hidden` and the mask token
    dflash     DFlash (eyas/draft/dflash/): a block of mask tokens denoised in one
               non-causal pass over the target's context features

What a family gives the stages (`Family`): `new_draft` builds an untrained draft for the data's
layout, `positions` says how many draft positions training and scoring unroll, `save` writes
the directory vLLM loads (with eyas's keys and `eyas_family`), `speculative` the entries of
vLLM's speculative config beyond the model and k. Reading a draft back, and the speculative
config of any draft directory, are `eyas.draft.load`'s (each family's formats module is one
entry of its FAMILIES); this module imports none of eyas.draft.

A family's model answers like eyas.draft.eagle3.model.Eagle3Draft: attributes `config` (with
hidden_size, target_hidden_size, num_aux_hidden_states), `fc`, `lm_head`, `d2t`, `t2d`,
`vocab`, `init_lm_head_from_target`; a model other than Eagle3Draft's chain also has
`draft_steps(call, input_ids, hidden, steps, scheme)` returning, per draft position k, (state,
logits [B, T, draft_vocab]) where row r predicts token r+k+2: the alignment of
eyas/draft/eagle3/ttt.py, so the TTT loss, the accuracies and predicted τ (chain acceptance:
a step's drafts are accepted up to the first miss) are every family's. `call` is the module
to call forward through (a data-parallel wrapper, or the model).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from eyas.config import DRAFT_FAMILIES as FAMILIES  # the schema names them

DEFAULT = "eagle3"
FAMILY_KEY = "eyas_family"  # in an eyas draft's config.json: the family that wrote it

# the options that define EAGLE 3.1, applied over draft.* (eyas.config.DraftConfig)
EAGLE31_OPTIONS = {"fc_norm": True, "norm_output": True, "norm_before_fc": False}


@dataclass(frozen=True)
class Family:
    name: str
    # (target's HF config, number of draft-input slots, DraftVocab, target embedding, the
    # run's DraftConfig) -> an untrained draft
    new_draft: Callable
    # (DraftConfig, TrainConfig) -> draft positions trained and scored per step
    positions: Callable
    # (draft, layout, vocab, out_dir, extra) -> the draft directory
    save: Callable
    # () -> vLLM's speculative_config entries beyond `model` and `num_speculative_tokens`
    speculative: Callable


def get(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"draft.family={name!r}: one of {', '.join(FAMILIES)}")
    module = {"eagle3": "eagle3", "eagle3.1": "eagle3", "peagle": "peagle",
              "dflash": "dflash"}[name]
    return importlib.import_module(f"eyas.draft.{module}.family").family(name)
