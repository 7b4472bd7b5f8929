"""What P-EAGLE's readers share: the model's arguments from what vLLM reads of a config."""
from __future__ import annotations

from eyas.conventions.vllm_checkpoint import (
    MASK_HIDDEN,
    peagle_weight_shapes,
    read_draft_config,
    read_mask_token_id,
)
from eyas.draft.claims import FormatError, model_args_from
from eyas.draft.weights import EMBED
from eyas.layout import TargetIdentity

FAMILY = "peagle"


def model_args(config: dict, shapes: dict, target: TargetIdentity, source: str) -> dict:
    """PEagleConfig's fields from what vLLM reads of the config and the weights' shapes:
    EAGLE-3's for layer 0 (eyas.draft.claims.model_args_from), then the layer count and mask id;
    every tensor held to P-EAGLE's names and shapes."""
    mask_id = read_mask_token_id(config)
    if mask_id is None:
        raise FormatError(f"{source}: no mask token id (mask_token_id, pard_token, ptd_token_id "
                          "or dflash_config.mask_token_id); vLLM's parallel drafting refuses "
                          "such a draft")
    if MASK_HIDDEN not in shapes:
        raise FormatError(f"{source}: the weights hold no {MASK_HIDDEN}; vLLM's parallel "
                          "drafting refuses to load such a draft")
    layers = int(config.get("num_hidden_layers", 1))
    first = {k: v for k, v in shapes.items()
             if k != MASK_HIDDEN and not k.startswith("layers.")}
    args = model_args_from({**config, "num_hidden_layers": 1}, read_draft_config(config),
                           first, target, source)
    args.update(mask_token_id=mask_id, num_layers=layers)
    if not 0 <= mask_id < int(args["vocab_size"]):
        raise FormatError(f"{source}: mask token id {mask_id} outside the vocabulary of "
                          f"{args['vocab_size']}")
    expected = peagle_weight_shapes(args)
    unexpected = sorted(k for k in set(shapes) - set(expected) if k != EMBED)
    wrong = [f"{k} {shapes[k]} (expected {v})" for k, v in expected.items()
             if k in shapes and tuple(shapes[k]) != v]
    lacking = sorted(k for k in expected if k not in shapes and k not in ("d2t", "t2d"))
    if unexpected or wrong or lacking:
        raise FormatError(f"{source}: weights differ from a {layers}-layer P-EAGLE draft "
                          f"(unexpected {unexpected}, wrong shapes {wrong}, missing {lacking})")
    return args
