"""vLLM's MLA draft, `Eagle3DeepseekV2ForCausalLM` / `Eagle3DeepseekV3ForCausalLM` (DeepSeek
and Kimi targets): the EAGLE-3 layer around multi-head latent attention.

Read in vLLM 0.32 (model_executor/models/deepseek_eagle3.py, deepseek_v2.py): the layer's
attention is DeepseekV2MLAAttention over the 2H-wide [input_layernorm(embeds),
hidden_norm(h)] (eyas/draft/eagle3/mla.py computes it), the MLP is plain (no MoE), weights are
`midlayer.*` (or `layers.0.*`) with `q_a_proj`/`kv_a_proj_with_mqa` fused by the loader. The
ids are read as for the Llama draft (vLLM's generic eagle3 id lookup: formats.eagle3). Of the
normalisation options it applies `fc_norm`, `norm_before_residual` and `norm_output`; it has
no `norm_before_fc` (no `input_norm`), so a config or weights asking for it are refused: vLLM
would serve another function than the one trained.
"""
from __future__ import annotations

import eyas.draft.eagle3.formats.eagle3 as eagle3
from eyas.draft.claims import Claims, FormatError, model_args_from
from eyas.conventions.vllm_checkpoint import MLA_DRAFT_ARCHITECTURES, MLA_KEYS, read_draft_config
from eyas.layout import TargetIdentity


def matches(config: dict) -> bool:
    return bool(set(config.get("architectures") or []) & set(MLA_DRAFT_ARCHITECTURES))


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    lacking = [k for k in MLA_KEYS if k != "q_lora_rank" and not config.get(k)]
    if lacking:
        raise FormatError(f"{source}: an MLA draft ({config.get('architectures')}) whose config "
                          f"lacks {lacking}")
    mla = {k: (int(config[k]) if config.get(k) else None) for k in MLA_KEYS}
    view = read_draft_config(config)
    if view.options["norm_before_fc"] or any(k.startswith("input_norm.") for k in shapes):
        raise FormatError(f"{source}: norm_before_fc (input_norm) in an MLA draft: vLLM's "
                          "deepseek_eagle3 has no such norm and would serve the draft without "
                          "it, another function than the one trained")
    args = model_args_from(config, view, shapes, target, source, mla)
    notes = [f"multi-head latent attention (q_lora_rank {mla['q_lora_rank']}, kv_lora_rank "
             f"{mla['kv_lora_rank']}), as vLLM's deepseek_eagle3 serves it"]
    return eagle3.claims_from_ids("eagle3-mla", args, view, shapes, target, source, notes)
