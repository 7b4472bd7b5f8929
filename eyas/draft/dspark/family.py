"""DSpark as a registered draft family (eyas.draft.families): the model of model.py, trained by
the TTT loss over its K = block_size slots (every slot drafts, the anchor's too) with the
confidence head's term (`auxiliary_loss`), pooled into one mean over every scored position as
DFlash's; written by checkpoint.py, read by formats.py, served by vLLM's V2 runner (a GPU)
with method "dspark" and num_speculative_tokens = block_size."""
from __future__ import annotations

from eyas.conventions.kinds import KINDS
from eyas.conventions.vllm_dspark import METHOD
from eyas.draft.dspark import formats
from eyas.draft.dspark.checkpoint import save_draft
from eyas.draft.dspark.model import DEFAULT_MARKOV_RANK, DSparkConfig, DSparkDraft
from eyas.draft.spec import Family, hyper_overrides
from eyas.draft.vocab import choose_mask_token


def _block_size(settings) -> int:
    if settings.block_size is None:
        raise ValueError("draft.block_size is unset for a dspark draft; the run's config "
                         "resolves it to serve.num_speculative_tokens (set it, e.g. "
                         "draft.block_size=4)")
    return int(settings.block_size)


def new_draft(target_config, num_slots, vocab, embed, settings):
    weight = getattr(embed, "weight", embed)
    config = DSparkConfig.from_target(
        target_config, num_slots, vocab.size, choose_mask_token(target_config, weight, vocab),
        _block_size(settings), settings.num_layers or 1, **hyper_overrides(settings),
        markov_rank=settings.markov_rank or DEFAULT_MARKOV_RANK)
    return DSparkDraft(config, embed, vocab)


def rules(draft, train, k: int, serving_other: bool) -> dict:
    """A block of B is served as B drafts (the anchor's slot drafts too): the block size
    defaults to k and must equal k when this run serves the draft. train.ttt_steps is not a
    DSpark draft's: its positions are the block's."""
    block = k if draft.block_size is None else draft.block_size
    if not serving_other and block != k:
        raise ValueError(
            f"draft.block_size={block} with serve.num_speculative_tokens={k}: vLLM "
            f"serves a DSpark block of B as B drafted tokens (its anchor slot drafts too), "
            f"and the block's slots attend to each other, so a draft trained on blocks of "
            f"{block} is served only with serve.num_speculative_tokens={block}; set one to "
            "match the other (or leave draft.block_size unset)")
    if block < 2:
        raise ValueError(
            f"draft.block_size={block}: a dspark block is the anchor and at least one mask "
            "(serve.num_speculative_tokens >= 2; for one drafted token train draft.family="
            "eagle3)")
    return {"block_size": block, "markov_rank": draft.markov_rank or DEFAULT_MARKOV_RANK}


DSPARK = Family("dspark", KINDS["dspark"], new_draft,
                lambda settings, train: _block_size(settings), save_draft,
                {"method": METHOD}, formats, rules, pooled_loss=True, anchor_drafts=True)
