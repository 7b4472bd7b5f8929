"""eyas's own P-EAGLE format: a LlamaForCausalLMEagle3 config with `eyas_family: "peagle"`,
`eyas_layout` (the slots it was trained on, by name) and `eyas_model_args` (PEagleConfig's
fields), as eyas.draft.peagle.checkpoint writes it; held to that record as EAGLE-3's own format
is (eyas.draft.eagle3.formats.own)."""
from __future__ import annotations

from eyas.conventions.vllm_checkpoint import read_draft_config
from eyas.draft.directory import LAYOUT_KEY, MODEL_ARGS_KEY
from eyas.draft.eagle3.formats import eagle3 as eagle3_format
from eyas.draft.eagle3.formats import own as eagle3_own
from eyas.draft.eagle3.formats.common import Claims, FormatError
from eyas.draft.families import FAMILY_KEY
from eyas.draft.peagle.formats.common import FAMILY, model_args
from eyas.layout import HiddenStateLayout, TargetIdentity


def matches(config: dict) -> bool:
    return (LAYOUT_KEY in config and config.get(FAMILY_KEY) == FAMILY
            and eagle3_format.matches(config))


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    args = model_args(config, shapes, target, source)
    lost = eagle3_own.lost_norm_options(config)
    if lost:
        raise FormatError(f"{source}: {lost}")
    stored = config.get(MODEL_ARGS_KEY)
    if stored is not None:
        differ = [k for k in args if stored.get(k) != args[k]]
        if differ:
            raise FormatError(f"{source}: {MODEL_ARGS_KEY} and the keys vLLM reads differ "
                              f"on {differ}, so eyas would rebuild another draft than vLLM "
                              "serves; was config.json edited by hand?")
        args = dict(stored)
    recorded = HiddenStateLayout.from_dict(config[LAYOUT_KEY], source=source)
    notes = []
    if recorded.target.num_layers != target.num_layers:
        notes.append(f"the draft was trained for a {recorded.target.num_layers}-block "
                     f"target; this one has {target.num_layers}")
    return Claims("eyas", args, read_draft_config(config), recorded,
                  f"{LAYOUT_KEY} {recorded.names}", "d2t" in shapes, notes)
