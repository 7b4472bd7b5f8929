"""What a draft family is, as types: `Family`, a family eyas trains (registered in
eyas/draft/families.py; its `DraftKind`, what any draft's config reads as, is
eyas/conventions/kinds.py's); `DraftModel`, the interface every family's model answers.

Callers outside eyas/draft ask a kind or a family for a property (`kind.block`,
`family.served_k(...)`), never compare its name.

Two numbers and their names: `k`, the tokens a draft proposes per speculative
round when served (vLLM's num_speculative_tokens, `serve.num_speculative_tokens`), and
`ttt_steps` (`steps` inside the objective and the accuracies, eyas/draft/ttt.py), the draft
positions training unrolls and scoring measures (`train.ttt_steps`). A draft is trained on at
least as many positions as it is served (`chain_rules`); optimizer steps are the loop's `step`.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Protocol, runtime_checkable

import torch

from eyas.conventions.kinds import DraftKind


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
    """A model drafting every position of a step in one pass (P-EAGLE, DFlash, DSpark): per
    draft position k, (state, logits [B, T, draft_vocab]) where row r predicts token r+k+2,
    the alignment of eyas/draft/ttt.py, so the TTT loss, the accuracies and predicted τ are
    every family's (the state is what the model's own `auxiliary_loss`, if any, reads:
    DSpark's confidence logits [B, T]). `call` is the module to call forward through (a
    data-parallel wrapper, or the model). A model without `draft_steps` is EAGLE-3's chain,
    unrolled by ttt.py."""

    def draft_steps(self, call, input_ids, hidden, steps: int, scheme: str = "inference"): ...


@dataclass(frozen=True)
class Family:
    """A draft family eyas trains: one entry of eyas/draft/families.py's registry."""

    name: str
    kind: DraftKind
    # (target's HF config, number of draft-input slots, DraftVocab, target embedding, the
    # run's DraftConfig) -> an untrained DraftModel
    new_draft: Callable
    # (DraftConfig, TrainConfig) -> draft positions trained and scored per optimizer step
    # (train.ttt_steps for a chain family, a DFlash block's block_size - 1, a DSpark
    # block's block_size)
    ttt_steps: Callable
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
    # the loss is one mean over every scored position of every draft position (DFlash's
    # reference: a block's positions pooled, eyas.draft.ttt.pooled), not a mean per position
    pooled_loss: bool = False
    # a row of draft position k >= 1 counts only where positions 1..k all predict counted
    # tokens there (P-EAGLE's reference, whose COD sampling draws a depth's rows among the
    # previous depth's; eyas.draft.ttt.step_rows), not wherever position k's token counts
    chained_rows: bool = False
    # a block family whose anchor slot drafts too (DSpark's sample_from_anchor): a block of B
    # drafts B tokens, DFlash's B-1
    anchor_drafts: bool = False

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
        if not self.kind.block:
            return k
        return settings.block_size - (0 if self.anchor_drafts else 1)


def no_markov_head(draft) -> None:
    """Refuse draft.markov_rank for a family without DSpark's Markov head."""
    if draft.markov_rank is not None:
        raise ValueError(f"draft.markov_rank={draft.markov_rank} is a dspark draft's (the rank "
                         f"of its Markov head); draft.family={draft.family} has none (unset "
                         "draft.markov_rank, or set draft.family=dspark)")


def chain_rules(draft, train, k: int, serving_other: bool) -> dict:
    """The config rules of a family drafting one token per position (EAGLE-3, P-EAGLE)."""
    no_markov_head(draft)
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


def hyper_overrides(settings) -> dict:
    """The draft.* sizes that override the target's (null: the target's)."""
    return {k: v for k, v in (("hidden_size", settings.hidden_size),
                              ("num_attention_heads", settings.num_heads),
                              ("intermediate_size", settings.intermediate_size)) if v}
