"""eyas's own P-EAGLE format: a LlamaForCausalLMEagle3 config with `eyas_family: "peagle"`,
`eyas_layout` (the slots it was trained on, by name) and `eyas_model_args` (PEagleConfig's
fields), as eyas.draft.peagle.checkpoint writes it; held to that record as EAGLE-3's own format
is (eyas.draft.eagle3.formats.own)."""
from __future__ import annotations

from eyas.conventions.vllm_checkpoint import read_draft_config
from eyas.draft.directory import LAYOUT_KEY
from eyas.draft.eagle3.formats import eagle3 as eagle3_format
from eyas.draft.eagle3.formats import own as eagle3_own
from eyas.draft.claims import Claims
from eyas.conventions.kinds import FAMILY_KEY
from eyas.draft.peagle.formats.common import FAMILY, model_args
from eyas.layout import TargetIdentity


def matches(config: dict) -> bool:
    return (LAYOUT_KEY in config and config.get(FAMILY_KEY) == FAMILY
            and eagle3_format.matches(config))


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    return eagle3_own.claims(config, model_args(config, shapes, target, source),
                             read_draft_config(config), shapes, target, source)
