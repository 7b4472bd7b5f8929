"""The EAGLE-3 draft checkpoint vLLM loads as `LlamaForCausalLMEagle3`
(model_executor/models/llama_eagle3.py): its config keys and weight names live here and
nowhere else, and `check_draft_config` reads a draft config the way vLLM will, refusing one it
would silently mis-read. What the aux ids mean is eyas/engines/vllm.py's.
"""
from __future__ import annotations

from eyas.engines import family
from eyas.engines.vllm import AUX_IDS_KEY, default_ids, to_ids
from eyas.layout import HiddenStateLayout, LayoutError

DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
DRAFT_ARCHITECTURES = (DRAFT_ARCHITECTURE, "Eagle3LlamaForCausalLM")  # both map to one class
DRAFT_WEIGHTS_FILE = "model.safetensors"
# Draft hyper-parameters, written under these config.json keys (eyas.draft.model.Eagle3Config's field names).
DRAFT_HYPER_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "rms_norm_eps", "max_position_embeddings", "vocab_size",
                    "draft_vocab_size", "target_hidden_size", "num_aux_hidden_states",
                    "hidden_act", "rope_parameters")
# deepseek_eagle3.py: the same layer around multi-head latent attention (DeepSeek/Kimi drafts),
# its ranks and head dims under these keys; eyas reads such drafts (it trains Llama ones)
MLA_DRAFT_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
DRAFT_INDEX_DTYPES = {"d2t": "int64", "t2d": "bool"}  # the other tensors are in the model dtype
# llama_eagle3.py's normalisation options (eyas.draft.model says what each computes). vLLM
# reads `norm_before_fc` from eagle_config first, then the top level; the others from the top
# level only; absent means off. eyas writes norm_before_fc in both places.
NORM_OPTIONS = ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")


def read_norm_options(config: dict) -> dict[str, bool]:
    """The options as vLLM 0.32 reads them from a draft config.json."""
    eagle = config.get("eagle_config") or {}
    out = {k: bool(config.get(k, False)) for k in NORM_OPTIONS}
    out["norm_before_fc"] = bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False)))
    return out


def draft_weight_shapes(hyper: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a draft's model.safetensors and its shape (no `embed_tokens.weight`:
    without one vLLM shares the target's embedding). `midlayer.` is vLLM's `layers.0.`; the
    q/k/v and gate/up pairs are fused by its loader. `d2t` is an offset (target id = draft id +
    d2t[draft id]); `t2d` is ignored by vLLM but read by SGLang and eyas.
    """
    h, inter = hyper["hidden_size"], hyper["intermediate_size"]
    q, kv = (hyper["num_attention_heads"] * hyper["head_dim"],
             hyper["num_key_value_heads"] * hyper["head_dim"])
    attn = "midlayer.self_attn."
    slots, target_h = hyper["num_aux_hidden_states"], hyper["target_hidden_size"]
    options = {"input_norm.weight": (slots * target_h,)} if hyper.get("norm_before_fc") else {}
    if hyper.get("fc_norm"):
        options.update({f"fc_norm.{i}.weight": (target_h,) for i in range(slots)})
    attention = (mla_attention_shapes(hyper, attn) if hyper.get("mla") else {
        attn + "q_proj.weight": (q, 2 * h),  # input: [input_layernorm(embeds), hidden_norm(h)]
        attn + "k_proj.weight": (kv, 2 * h),
        attn + "v_proj.weight": (kv, 2 * h),
        attn + "o_proj.weight": (h, q)})
    return {
        **options,
        "fc.weight": (h, slots * target_h),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        **attention,
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,),
        "lm_head.weight": (hyper["draft_vocab_size"], h),
        "d2t": (hyper["draft_vocab_size"],),
        "t2d": (hyper["vocab_size"],),
    }


def mla_attention_shapes(hyper: dict, prefix: str) -> dict[str, tuple[int, ...]]:
    """An MLA draft layer's attention tensors (deepseek_eagle3.py's names, before its loader
    fuses q_a_proj with kv_a_proj_with_mqa) and their shapes; it reads 2H like the Llama one."""
    m, h = hyper["mla"], hyper["hidden_size"]
    heads, qk = hyper["num_attention_heads"], m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
    shapes = {}
    if m.get("q_lora_rank"):
        shapes.update({"q_a_proj.weight": (m["q_lora_rank"], 2 * h),
                       "q_a_layernorm.weight": (m["q_lora_rank"],),
                       "q_b_proj.weight": (heads * qk, m["q_lora_rank"])})
    else:
        shapes["q_proj.weight"] = (heads * qk, 2 * h)
    shapes.update({
        "kv_a_proj_with_mqa.weight": (m["kv_lora_rank"] + m["qk_rope_head_dim"], 2 * h),
        "kv_a_layernorm.weight": (m["kv_lora_rank"],),
        "kv_b_proj.weight": (heads * (m["qk_nope_head_dim"] + m["v_head_dim"]),
                             m["kv_lora_rank"]),
        "o_proj.weight": (h, heads * m["v_head_dim"])})
    return {prefix + k: v for k, v in shapes.items()}


def draft_config(hyper: dict, layout: HiddenStateLayout, dtype: str,
                 version: str | None = None) -> dict:
    """config.json of a draft vLLM loads unmodified.

    The aux ids go in BOTH places vLLM reads: top-level `eagle_aux_hidden_state_layer_ids`
    (preferred) and `eagle_config.eagle_aux_hidden_state_layer_ids`; `num_aux_hidden_states`
    sizes fc (else the eagle_config list's length, else 3). E.g. a 4-block target, layout
    [embed, block_out:1, block_out:3] -> ids [0, 2, 4] in both places, num_aux_hidden_states 3.
    """
    if hyper.get("mla"):
        raise ValueError("an MLA draft is written in its own (deepseek_eagle3) config, not as "
                         f"{DRAFT_ARCHITECTURE}: eyas trains Llama drafts and reads MLA ones")
    ids = to_ids(layout, version)
    layout.expect_draft_inputs(hyper["num_aux_hidden_states"], "the draft's fc")
    missing = [k for k in DRAFT_HYPER_KEYS if k not in hyper]
    if missing:
        raise ValueError(f"draft hyper-parameters lack {missing}")
    config = {"architectures": [DRAFT_ARCHITECTURE], "model_type": "llama",
              "num_hidden_layers": 1, **{k: hyper[k] for k in DRAFT_HYPER_KEYS},
              "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
              "torch_dtype": dtype, "dtype": dtype,
              **{k: bool(hyper.get(k, False)) for k in NORM_OPTIONS},
              "eagle_aux_hidden_state_layer_ids": list(ids),
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids),
                               "use_aux_hidden_state": True,
                               "norm_before_fc": bool(hyper.get("norm_before_fc", False))}}
    if "rope_theta" in hyper["rope_parameters"]:  # mirrored for readers older than rope_parameters
        config["rope_theta"] = hyper["rope_parameters"]["rope_theta"]
    return config


def read_draft_config(config: dict, source: str = "draft config") -> tuple[dict, list[int]]:
    """(hyper-parameters, aux ids) of a draft config.json, read the way vLLM reads it."""
    archs = config.get("architectures") or []
    if not set(archs) & set(DRAFT_ARCHITECTURES):
        raise ValueError(f"{source}: architectures {archs} is not an EAGLE-3 Llama draft "
                         f"({', '.join(DRAFT_ARCHITECTURES)})")
    if config.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"{source}: num_hidden_layers={config['num_hidden_layers']}; eyas "
                         "builds one-layer drafts")
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = config.get("eagle_aux_hidden_state_layer_ids")
    if top is not None and nested is not None and list(top) != list(nested):
        raise LayoutError(f"{source}: eagle_aux_hidden_state_layer_ids {list(top)} (read by vLLM)"
                          f" differs from eagle_config's {list(nested)} (read by SGLang)")
    ids = top if top is not None else nested
    if ids is None:
        raise LayoutError(f"{source}: no eagle_aux_hidden_state_layer_ids; vLLM would use its "
                          "default ids, which eyas refuses to guess")
    hyper = dict(config)
    hyper.setdefault("num_aux_hidden_states", len(nested) if nested is not None else 3)
    hyper.setdefault("target_hidden_size", config.get("hidden_size"))
    hyper.setdefault("hidden_act", "silu")  # transformers' LlamaConfig default
    heads = config.get("num_attention_heads")
    hyper.setdefault("num_key_value_heads", heads)
    if hyper.get("head_dim") is None and heads:
        hyper["head_dim"] = config["hidden_size"] // heads
    if not hyper.get("rope_parameters"):
        hyper["rope_parameters"] = {"rope_type": "default",
                                    "rope_theta": config.get("rope_theta", 10000.0),
                                    **(config.get("rope_scaling") or {})}
    missing = [k for k in DRAFT_HYPER_KEYS if hyper.get(k) is None]
    if missing:
        raise ValueError(f"{source}: missing {missing}")
    return ({**{k: hyper[k] for k in DRAFT_HYPER_KEYS}, **read_norm_options(config)},
            [int(i) for i in ids])


# -- checks before a boot: where vLLM 0.32 would silently mis-read a draft config ----------
# Read in llama_eagle3.py / gpu_model_runner.py: the TARGET captures the top-level
# `eagle_aux_hidden_state_layer_ids`, else `eagle_config`'s, else the default (2, N//2, N-3);
# the DRAFT sizes `fc` from `num_aux_hidden_states`, else `len(eagle_config ids)`, else 3.
# An empty list counts as missing.
def check_draft_config(draft_config: dict, target_num_layers: int, *,
                       target_architecture: str = "LlamaForCausalLM",
                       target_hidden_size: int | None = None,
                       target_vocab_size: int | None = None,
                       source: str = "draft config") -> list[int]:
    """The aux ids vLLM will capture for this draft, in concat order; LayoutError where vLLM
    would read the config differently from what it says (so serving would be silently wrong).

    Worked example, a 4-block Llama target, draft trained on [embed, block_out:1, block_out:3]:
      {"eagle_aux_hidden_state_layer_ids": [0, 2, 4],
       "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}}      -> [0, 2, 4]
      ids only top-level             -> refused: fc is sized from eagle_config (else 3), and
                                        SGLang reads only eagle_config
      ids only under eagle_config    -> [0, 2, 4] (vLLM reads them for capture and fc alike)
      no ids                         -> refused: vLLM would use (2, 2, 1) -> [1, 2], 2 states
      [4, 0, 2]                      -> refused: vLLM concatenates ascending, [0, 2, 4]
    """
    n = target_num_layers
    fam = family(target_architecture)
    top = list(draft_config.get(AUX_IDS_KEY) or [])
    eagle = draft_config.get("eagle_config") or {}
    nested = list(eagle.get(AUX_IDS_KEY) or [])
    if not top and not nested:
        dflt = default_ids(n)
        used = sorted(set(dflt)) if fam != "deepseek" else list(dflt)
        note = (f", only {len(used)} distinct where fc expects 3 (the first decode step would "
                "crash)" if len(used) < 3 else "")
        raise LayoutError(
            f"{source}: no {AUX_IDS_KEY} (top-level or under eagle_config). vLLM would use its "
            f"default ids {dflt} for a {n}-block target -> {used}{note}; which slots the draft "
            "was trained on is unknown. Write the layout's vLLM ids in both places")
    if top and not nested:
        raise LayoutError(
            f"{source}: {AUX_IDS_KEY} {top} only at top level. vLLM captures those, but sizes "
            "the draft's fc from num_aux_hidden_states, else from eagle_config's list, else 3; "
            "SGLang reads only eagle_config. Write the ids under eagle_config too")
    if top and nested and top != nested:
        raise LayoutError(
            f"{source}: top-level {AUX_IDS_KEY} {top} (what vLLM captures) differs from "
            f"eagle_config's {nested} (what sizes vLLM's fc and what SGLang reads)")
    ids = top or nested
    if eagle.get("use_aux_hidden_state") is False:
        raise LayoutError(f"{source}: eagle_config.use_aux_hidden_state is false, so vLLM feeds "
                          f"the draft no aux states at all, though it names ids {ids}")
    num_aux = draft_config.get("num_aux_hidden_states")
    if num_aux is not None and int(num_aux) != len(ids):
        raise LayoutError(f"{source}: num_aux_hidden_states={num_aux} sizes fc for {num_aux} "
                          f"states, but the ids {ids} capture {len(ids)}")
    bad = [i for i in ids if not 0 <= int(i) <= n]
    if bad:
        raise LayoutError(f"{source}: ids {bad} out of range 0..{n} for a {n}-block target "
                          "(vLLM id k = input of block k; N = the last block's pre-norm output)")
    if fam == "deepseek" and 0 in ids:
        raise LayoutError(f"{source}: id 0 (embedding) crashes vLLM's DeepSeek-family "
                          "capture (no residual before layer 0)")
    if ids != sorted(set(ids)):  # Llama sorts them; DeepSeek captures in layer order
        raise LayoutError(
            f"{source}: ids {ids} are not ascending and distinct; vLLM captures sorted(set(ids))"
            f" = {sorted(set(ids))} and concatenates in that order, not the written one")
    drafts_target_hidden = draft_config.get("target_hidden_size", draft_config.get("hidden_size"))
    if target_hidden_size is not None and drafts_target_hidden != target_hidden_size:
        raise LayoutError(f"{source}: target_hidden_size {drafts_target_hidden} but the target's "
                          f"hidden size is {target_hidden_size}")
    vocab = draft_config.get("vocab_size")
    if target_vocab_size is not None and vocab != target_vocab_size:
        raise LayoutError(f"{source}: vocab_size {vocab} but the target's vocab is "
                          f"{target_vocab_size} (d2t maps into the target's vocab)")
    draft_vocab = draft_config.get("draft_vocab_size")
    if draft_vocab is not None and vocab is not None and int(draft_vocab) > int(vocab):
        raise LayoutError(f"{source}: draft_vocab_size {draft_vocab} > vocab_size {vocab}")
    return [int(i) for i in ids]
