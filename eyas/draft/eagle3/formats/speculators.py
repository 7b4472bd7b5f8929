"""vllm-project/speculators' saved Eagle3 draft.

Schema read in speculators (src/speculators/config.py `SpeculatorModelConfig`,
src/speculators/models/eagle3/config.py `Eagle3SpeculatorConfig`, models/eagle3/core.py) and
in vLLM 0.32's converter (transformers_utils/configs/speculators/algos.py `update_eagle3`):
- no `model_type`; `speculators_model_type` "eagle3", `speculators_config` (verifier,
  proposal_methods), `transformer_layer_config` holding the decoder layer's hyper-parameters;
- top-level `eagle_aux_hidden_state_layer_ids` in vLLM's convention (captured through vLLM),
  `draft_vocab_size`, `target_hidden_size`, `norm_before_fc`, `fc_norm`, `norm_output`,
  `norm_before_residual` (vLLM's converter defaults an ABSENT norm_before_residual to true,
  the others to false: the draft is read with the options vLLM will apply);
- weights `layers.0.*`, `fc`, `norm`, `lm_head`, a frozen `embed_tokens` copy of the
  verifier's, `input_norm` with norm_before_fc, `d2t`/`t2d` only for a reduced vocabulary.
vLLM builds its config from transformer_layer_config plus those keys only: no eagle_config
and no num_aux_hidden_states, so its fc takes 3 states whatever the id list says.
"""
from __future__ import annotations

from eyas.draft.claims import (
    Claims,
    FormatError,
    claimed_from_vllm_ids,
    model_args_from,
)
from eyas.conventions.vllm import AUX_IDS_KEY
from eyas.conventions.vllm_checkpoint import read_draft_config
from eyas.layout import TargetIdentity

VLLM_LAYER_TYPES = ("llama", "qwen3")  # algos.py: any other model_type is a ValueError


def matches(config: dict) -> bool:
    return "speculators_config" in config


def vllm_config(config: dict) -> dict:
    """The config vLLM builds from a speculators one (algos.py `update_eagle3`):
    transformer_layer_config, plus the ids, draft_vocab_size and target_hidden_size where set,
    and the norm options, an absent norm_before_residual turned on."""
    layer = dict(config.get("transformer_layer_config") or {})
    copied = {k: config[k] for k in (AUX_IDS_KEY, "draft_vocab_size", "target_hidden_size")
              if config.get(k) is not None}
    options = {k: bool(config.get(k, False)) for k in ("norm_before_fc", "fc_norm", "norm_output")}
    options["norm_before_residual"] = bool(config.get("norm_before_residual", True))
    return {**layer, **copied, **options}


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise FormatError(f"{source}: speculators_model_type {kind!r}; eyas reads eagle3 drafts")
    layer = config.get("transformer_layer_config") or {}
    if layer.get("model_type", "llama") not in VLLM_LAYER_TYPES:
        raise FormatError(f"{source}: transformer_layer_config.model_type "
                          f"{layer.get('model_type')!r}: vLLM 0.32 builds eagle3 drafts for "
                          f"{VLLM_LAYER_TYPES} only (configs/speculators/algos.py)")
    converted = vllm_config(config)
    view, notes = read_draft_config(converted), []
    args = model_args_from(converted, view, shapes, target, source)
    ids = view.top_ids
    if "norm_before_residual" not in config:
        notes.append("norm_before_residual is absent, so vLLM's speculators converter turns it "
                     "on; the draft is examined with it on (write \"norm_before_residual\": "
                     "false if it was trained without)")
    verifier = ((config["speculators_config"].get("verifier") or {}).get("name_or_path"))
    if verifier:
        notes.append(f"trained against verifier {verifier}")
    layout = claimed_from_vllm_ids(ids, args["num_aux_hidden_states"], target, source, notes)
    says = (f"{AUX_IDS_KEY} {ids} (top-level, vLLM's convention: id k = input of layer k)"
            if ids else f"no {AUX_IDS_KEY}: which slots it was trained on is unknown")
    return Claims("speculators", args, view, layout, says, "d2t" in shapes, notes)
