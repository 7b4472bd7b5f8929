"""The registry of the draft families eyas trains (`draft.family`, whose choices are these
names), all from the same extraction: the layout names the slots once, and each family's
writer compiles them into its own config key with its own shift.

    eagle3     chain EAGLE-3 (eyas/draft/eagle3/): one step per drafted token
    eagle3.1   EAGLE-3 with one RMSNorm per aux slot before fc and the post-norm state fed
               back (fc_norm, norm_output; norm_before_fc off): the same model and writer
    peagle     P-EAGLE (eyas/draft/peagle/): EAGLE-3's layer, every draft of a step in one
               pass, the later positions fed a learned `mask_hidden` and the mask token
    dflash     DFlash (eyas/draft/dflash/): a block of mask tokens denoised in one
               non-causal pass over the target's context features
    dspark     DSpark (eyas/draft/dspark/): DFlash's block with every slot drafting, a
               Markov bias on the previous token and a confidence head (vLLM: a GPU only)

Each entry is an eyas.draft.spec.Family. A new family is its folder (model, objective if not
EAGLE-3's, checkpoint writer, readers, and a family.py building its Family) and one entry
here; tests/unit/test_families.py holds every entry to the same round trip.
"""
from __future__ import annotations

from eyas.draft.dflash.family import DFLASH
from eyas.draft.dspark.family import DSPARK
from eyas.draft.eagle3.family import EAGLE3, EAGLE31
from eyas.draft.peagle.family import PEAGLE
from eyas.draft.spec import Family

# in registration order: a later family's configs may extend an earlier one's (P-EAGLE's are
# EAGLE-3's and more), so the loader asks the latest registered readers first
REGISTRY: dict[str, Family] = {f.name: f for f in (EAGLE3, EAGLE31, PEAGLE, DFLASH, DSPARK)}
NAMES = tuple(REGISTRY)
DEFAULT = EAGLE3.name


def get(name: str) -> Family:
    if name not in REGISTRY:
        raise ValueError(f"draft.family={name!r}: one of {', '.join(NAMES)}")
    return REGISTRY[name]
