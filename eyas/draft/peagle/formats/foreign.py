"""A P-EAGLE draft of another trainer: a LlamaForCausalLMEagle3 config (no eyas_layout) with a
mask token id where vLLM's parallel drafter reads one (`mask_token_id`, `pard_token`,
`ptd_token_id`, `dflash_config.mask_token_id`); its ids are read as EAGLE-3's
(eyas.draft.eagle3.formats.eagle3: top-level ids as vLLM's convention, ids only under
eagle_config as SGLang's)."""
from __future__ import annotations

from eyas.conventions.vllm_checkpoint import read_draft_config, read_mask_token_id
from eyas.draft.directory import LAYOUT_KEY
from eyas.draft.eagle3.formats import eagle3 as eagle3_format
from eyas.draft.claims import Claims
from eyas.conventions.kinds import FAMILY_KEY
from eyas.draft.peagle.formats.common import FAMILY, model_args
from eyas.layout import TargetIdentity


def matches(config: dict) -> bool:
    return (LAYOUT_KEY not in config and config.get(FAMILY_KEY, FAMILY) == FAMILY
            and eagle3_format.matches(config) and read_mask_token_id(config) is not None)


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    args = model_args(config, shapes, target, source)
    return eagle3_format.claims_from_ids(FAMILY, args, read_draft_config(config), shapes,
                                         target, source, [])
