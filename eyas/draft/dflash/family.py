"""DFlash as a registered draft family (eyas.draft.families): the model of model.py, trained
by the TTT loss over its K = block_size - 1 block positions, pooled into one mean over every
scored position as its reference trains (model.py says why that is DFlash's objective),
written by checkpoint.py, read by formats.py, served by vLLM with method "dflash" and
num_speculative_tokens = block_size - 1."""
from __future__ import annotations

from eyas.draft.dflash import formats
from eyas.draft.dflash.checkpoint import save_draft
from eyas.draft.dflash.model import DFlashConfig, DFlashDraft
from eyas.conventions.kinds import KINDS
from eyas.draft.spec import Family, hyper_overrides, no_markov_head
from eyas.draft.vocab import choose_mask_token


def _block_size(settings) -> int:
    if settings.block_size is None:
        raise ValueError("draft.block_size is unset for a dflash draft; the run's config "
                         "resolves it to serve.num_speculative_tokens + 1 (set it, e.g. "
                         "draft.block_size=4)")
    return int(settings.block_size)


def new_draft(target_config, num_slots, vocab, embed, settings):
    weight = getattr(embed, "weight", embed)
    config = DFlashConfig.from_target(
        target_config, num_slots, vocab.size, choose_mask_token(target_config, weight, vocab),
        _block_size(settings), settings.num_layers or 1, **hyper_overrides(settings))
    return DFlashDraft(config, embed, vocab)


def rules(draft, train, k: int, serving_other: bool) -> dict:
    """A block of B is served as B-1 drafts: the block size defaults to k+1 and must agree
    with k when this run serves the draft. train.ttt_steps is not a DFlash draft's: its
    positions are the block's."""
    no_markov_head(draft)
    block = k + 1 if draft.block_size is None else draft.block_size
    if not serving_other and block != k + 1:
        raise ValueError(
            f"draft.block_size={block} with serve.num_speculative_tokens={k}: vLLM "
            f"serves a DFlash block of B as B-1 drafted tokens, and the block's masks "
            f"attend to each other, so a draft trained on blocks of {block} is "
            f"served only with serve.num_speculative_tokens={block - 1}; set one "
            "to match the other (or leave draft.block_size unset)")
    return {"block_size": block}


DFLASH = Family("dflash", KINDS["dflash"], new_draft,
                lambda settings, train: _block_size(settings) - 1, save_draft,
                {"method": "dflash"}, formats, rules, pooled_loss=True)
