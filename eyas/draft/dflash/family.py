"""DFlash as a draft family (eyas.draft.families): the model of model.py, trained by the
TTT loss over its K = block_size - 1 block positions (model.py says why that is DFlash's
objective), written by checkpoint.py, served by vLLM with method "dflash" and
num_speculative_tokens = block_size - 1."""
from __future__ import annotations

from eyas.draft.dflash.checkpoint import save_draft
from eyas.draft.dflash.model import DFlashConfig, DFlashDraft
from eyas.draft.vocab import choose_mask_token
from eyas.draft.eagle3.family import hyper_overrides
from eyas.draft.families import Family


def _block_size(settings) -> int:
    if settings.block_size is None:
        raise ValueError("draft.block_size is unset for a dflash draft; the run's config "
                         "resolves it to serve.num_speculative_tokens + 1 (set it, e.g. "
                         "draft.block_size=4)")
    return int(settings.block_size)


def family(name: str) -> Family:
    def new_draft(target_config, num_slots, vocab, embed, settings):
        weight = getattr(embed, "weight", embed)
        config = DFlashConfig.from_target(
            target_config, num_slots, vocab.size, choose_mask_token(target_config, weight, vocab),
            _block_size(settings), settings.num_layers or 1, **hyper_overrides(settings))
        return DFlashDraft(config, embed, vocab)

    def save(draft, layout, vocab, out_dir, extra=None):
        return save_draft(draft, layout, vocab, out_dir, extra)

    return Family(name, new_draft, lambda settings, train: _block_size(settings) - 1, save,
                  lambda: {"method": "dflash"})
