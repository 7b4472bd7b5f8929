"""What a draft family is, as types: `DraftKind`, what any draft's config reads as (eyas's
families and other trainers' alike), and `Family`, a family eyas trains (registered in
eyas/draft/families.py); `DraftModel`, the interface every family's model answers.

Callers outside eyas/draft ask a kind or a family for a property (`kind.block`,
`family.served_k(...)`), never compare its name.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Protocol, runtime_checkable

import torch

from eyas.conventions.vllm_checkpoint import DRAFT_ARCHITECTURES, read_mask_token_id
from eyas.draft.directory import FAMILY_KEY


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


@runtime_checkable
class DraftModel(Protocol):
    """Every family's model (Eagle3Draft's attributes): `config` has hidden_size,
    target_hidden_size and num_aux_hidden_states; the draft vocabulary maps to the target's."""

    config: object
    fc: torch.nn.Module
    lm_head: torch.nn.Module
    d2t: torch.Tensor
    t2d: torch.Tensor

    def init_lm_head_from_target(self, target_lm_head: torch.Tensor) -> None: ...


@runtime_checkable
class ParallelDraft(DraftModel, Protocol):
    """A model drafting every position of a step in one pass (P-EAGLE, DFlash): per draft
    position k, (state, logits [B, T, draft_vocab]) where row r predicts token r+k+2, the
    alignment of eyas/draft/eagle3/ttt.py, so the TTT loss, the accuracies and predicted τ are
    every family's. `call` is the module to call forward through (a data-parallel wrapper, or
    the model). A model without `draft_steps` is EAGLE-3's chain, unrolled by ttt.py."""

    def draft_steps(self, call, input_ids, hidden, steps: int, scheme: str = "inference"): ...


@dataclass(frozen=True)
class Family:
    """A draft family eyas trains: one entry of eyas/draft/families.py's registry."""

    name: str
    kind: DraftKind
    # (target's HF config, number of draft-input slots, DraftVocab, target embedding, the
    # run's DraftConfig) -> an untrained DraftModel
    new_draft: Callable
    # (DraftConfig, TrainConfig) -> draft positions trained and scored per step
    positions: Callable
    # (draft, layout, vocab, out_dir, extra) -> the draft directory
    save: Callable
    # vLLM's speculative_config entries beyond `model` and `num_speculative_tokens`
    speculative: dict
    # the reader module (eyas.draft.load): READERS, build, optionally tensor_shapes
    formats: ModuleType
    # (DraftConfig, TrainConfig, serve k, whether serve takes another draft) -> the draft.*
    # keys this family resolves (e.g. a DFlash block size); raises ValueError naming the keys
    # where they contradict each other
    rules: Callable
    max_layers: int | None = None  # decoder layers it can have (None: draft.num_layers)

    def resolve(self, draft, train, k: int, serving_other: bool) -> dict:
        """The draft.* keys the family decides for these settings; ValueError where they
        break its rules."""
        if self.max_layers is not None and (draft.num_layers or 1) > self.max_layers:
            most = ("one decoder layer" if self.max_layers == 1
                    else f"at most {self.max_layers} decoder layers")
            raise ValueError(f"draft.num_layers={draft.num_layers}: an {self.name} draft has "
                             f"{most} (peagle and dflash drafts take more)")
        return self.rules(draft, train, k, serving_other)

    def served_k(self, settings, k: int) -> int:
        """The tokens vLLM drafts per step for a draft of these settings (`k`: the run's)."""
        return settings.block_size - 1 if self.kind.block else k


def chain_rules(draft, train, k: int, serving_other: bool) -> dict:
    """The config rules of a family drafting one token per position (EAGLE-3, P-EAGLE)."""
    if train.anchors is not None:
        raise ValueError(f"train.anchors={train.anchors} samples a dflash draft's block "
                         f"anchors; draft.family={draft.family} trains every row (unset "
                         "train.anchors, or set draft.family=dflash)")
    if draft.block_size is not None:
        raise ValueError(f"draft.block_size={draft.block_size} is a dflash draft's; "
                         f"draft.family={draft.family} drafts one token per position")
    if not serving_other and k > train.ttt_steps:
        raise ValueError(
            f"serve.num_speculative_tokens={k} exceeds train.ttt_steps={train.ttt_steps}: "
            f"the draft is trained to propose {train.ttt_steps} tokens in a row, and past "
            f"that its proposals are rarely accepted; set serve.num_speculative_tokens<="
            f"{train.ttt_steps} (or train.ttt_steps>={k})")
    return {}
