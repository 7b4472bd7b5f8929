"""What a draft's config.json reads as, whoever trained it: its `DraftKind` (EAGLE-3, P-EAGLE,
DFlash, ... and the properties callers ask instead of comparing names), from the keys and
architectures engines read, or from the family an eyas draft names under `FAMILY_KEY`. Below
the draft layer: what an engine feeds a draft (eyas/conventions/feeds.py) depends on its kind,
not on whether eyas can train it (the families eyas trains: eyas/draft/families.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from eyas.conventions.vllm_checkpoint import DRAFT_ARCHITECTURES, read_mask_token_id

FAMILY_KEY = "eyas_family"  # an eyas draft's config.json: the registered family that wrote it


@dataclass(frozen=True)
class DraftKind:
    """A kind of draft, whoever trained it."""

    name: str  # eagle3 | eagle3.1 | mla-eagle3 | speculators-eagle3 | peagle | dflash | ...
    base: str  # the family it is a variant of: its profile method, the config it is served by
    readable: bool = False  # eyas loads and scores drafts of this kind whoever wrote them
    block: bool = False  # DFlash's shape: a block per pass, its ids name outputs of layers
    masked: bool = False  # its later positions are drafted from a mask token
    parallel_drafting: bool = False  # EAGLE-3's layer drafting a whole step in one pass
    llama_eagle3: bool = False  # the llama EAGLE-3 head of EAGLE's, SpecForge's and vLLM's code
    trainer: str | None = None  # the tool its format names (speculators)


KINDS = {k.name: k for k in (
    DraftKind("eagle3", "eagle3", readable=True, llama_eagle3=True),
    DraftKind("eagle3.1", "eagle3.1", readable=True, llama_eagle3=True),
    DraftKind("mla-eagle3", "eagle3", readable=True),
    DraftKind("speculators-eagle3", "eagle3", readable=True, trainer="speculators"),
    DraftKind("peagle", "peagle", readable=True, masked=True, parallel_drafting=True),
    DraftKind("dflash", "dflash", block=True, masked=True),  # eyas reads its own only
    DraftKind("dspark", "dspark", block=True, masked=True),
    DraftKind("domino", "domino", block=True),
)}


def draft_kind(config: dict) -> DraftKind:
    """The kind a draft's config.json reads as: the family an eyas draft names, else what
    its architectures and keys say."""
    if config.get(FAMILY_KEY):  # an eyas draft names its family (a later eyas's: unknown here)
        name = str(config[FAMILY_KEY])
        return KINDS.get(name) or DraftKind(name, name)
    archs = " ".join(config.get("architectures") or [])
    projector = (config.get("dflash_config") or {}).get("projector_type", "")
    if "speculators_config" in config or "speculators_model_type" in config:
        name = "speculators-" + str(config.get("speculators_model_type", "eagle3"))
        return KINDS.get(name) or DraftKind(name, name, trainer="speculators")
    if "Domino" in archs or projector == "domino":
        return KINDS["domino"]
    if "DSpark" in archs or projector == "dspark" or "dspark_target_layer_ids" in config:
        return KINDS["dspark"]
    if "DFlash" in archs or "dflash_config" in config or "target_layer_ids" in config:
        return KINDS["dflash"]
    if ("PEagle" in archs or "Peagle" in archs or config.get("parallel_drafting")
            or (read_mask_token_id(config) is not None
                and set(config.get("architectures") or []) & set(DRAFT_ARCHITECTURES))):
        return KINDS["peagle"]  # an EAGLE-3 config with a mask id: vLLM's parallel drafting
    if "Deepseek" in archs:
        return KINDS["mla-eagle3"]
    return KINDS["eagle3.1" if config.get("fc_norm") else "eagle3"]
