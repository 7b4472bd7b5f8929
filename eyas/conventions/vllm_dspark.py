"""The DSpark draft vLLM 0.32 loads (`method: "dspark"`, model_executor/models/qwen3_dspark.py
`Qwen3DSparkForCausalLM`, served by the V2 runner's v1/worker/gpu/spec_decode/dspark/
speculator.py): its config keys and weight names live here and nowhere else
(eyas/draft/dspark/ writes and reads drafts through this module).

A DSpark draft is a DFlash draft (eyas.conventions.vllm_dflash: the same backbone, ids, config
keys and tensor names, `dflash_config.target_layer_ids` read +1 by the V2 runner) plus two
heads, and one change of alignment:

    sample_from_anchor: true (top level: the DFlash speculator DSpark's subclasses refuses it
        under dflash_config) -> each request's block is num_speculative_tokens query slots,
        the anchor (the bonus token) and N-1 masks, and EVERY slot drafts: slot k predicts the
        token after its own position. So a block of B drafts B tokens (DFlash's: B-1), and
        vLLM's num_speculative_tokens defaults to `block_size` (config/speculative.py).
    markov_head.markov_w1.weight  [vocab_size, markov_rank]   (nn.Embedding of target ids)
    markov_head.markov_w2.weight  [draft_vocab_size, markov_rank]   (no bias)
        slot k's logits += markov_w2(markov_w1[previous token]), the previous token being
        the anchor for slot 0 and the token sampled at slot k-1 after it, added left to right
        (DSparkSpeculator._sample_sequential)
    confidence_head.proj.weight [1, hidden_size + markov_rank], .bias [1]
        sigmoid(proj(cat(final-normed slot state, markov_w1[previous token]))): the slot's
        predicted acceptance (enable_confidence_head, confidence_head_with_markov; loaded
        only when both the config enables it and the weights carry it)

Everything but lm_head/d2t is under `model.` in vLLM's modules (qwen3_dspark.py load_weights
adds the prefix); t2d is skipped; d2t is required (and lm_head) for a reduced vocabulary.
The architecture is Qwen3DSparkModel with model_type qwen3 (the registry's `qwen3_dspark`;
config/speculative.py resolves method "dspark" from it).
"""
from __future__ import annotations

from eyas.conventions import vllm_dflash
from eyas.layout import HiddenStateLayout

ARCHITECTURE = "Qwen3DSparkModel"  # model_executor/models/registry.py -> qwen3_dspark
METHOD = "dspark"
KINDS = frozenset({"dspark"})  # the draft kinds (eyas.conventions.kinds) read by this module
MARKOV_HEAD_TYPE = "vanilla"  # qwen3_dspark.py's DSparkMarkovHead: the first-order bias only
# DSparkConfig's fields written as config.json keys of the same name: DFlash's, the Markov
# head's rank (qwen3_dspark.py reads config.markov_rank) and the block (vLLM's default k)
HYPER_KEYS = (*vllm_dflash.HYPER_KEYS, "markov_rank", "block_size")
WEIGHTS = ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
           "confidence_head.proj.weight", "confidence_head.proj.bias")


def draft_config(args: dict, layout: HiddenStateLayout, dtype: str) -> dict:
    """config.json of a DSpark draft vLLM's V2 runner loads unmodified (`args`: DSparkConfig's
    fields): the DFlash config with DSpark's architecture and keys."""
    missing = [k for k in HYPER_KEYS if k not in args]
    if missing:
        raise ValueError(f"DSpark draft arguments lack {missing}")
    config = vllm_dflash.draft_config(args, layout, dtype)
    config["architectures"] = [ARCHITECTURE]
    config.update({"markov_rank": int(args["markov_rank"]), "markov_head_type": MARKOV_HEAD_TYPE,
                   "block_size": int(args["block_size"]), "sample_from_anchor": True,
                   "enable_confidence_head": True, "confidence_head_with_markov": True})
    return config


def weight_shapes(args: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor a DSpark draft's weights file holds, with its shape (module docstring)."""
    shapes = vllm_dflash.weight_shapes(args)
    rank = args["markov_rank"]
    shapes.update(dict(zip(WEIGHTS, ((args["vocab_size"], rank),
                                     (args["draft_vocab_size"], rank),
                                     (1, args["hidden_size"] + rank), (1,)))))
    return shapes


def served_k(config: dict) -> int | None:
    """The num_speculative_tokens that serves a DSpark config.json's blocks as they were
    trained (the slots attend to each other, so the block's length matters): its block_size
    (or dspark_block_size) with sample_from_anchor (DSparkSpeculator's default, true: every
    slot drafts), one less without it (the DFlash fill-in layout of 1 + N queries). None where
    the config names no block."""
    block = config.get("block_size", config.get("dspark_block_size"))
    if block is None:
        return None
    return int(block) - (0 if config.get("sample_from_anchor", True) else 1)
