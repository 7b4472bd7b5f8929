"""The EAGLE-3 draft checkpoint vLLM loads as `LlamaForCausalLMEagle3`
(model_executor/models/llama_eagle3.py): its config keys and weight names live here and
nowhere else. `read_draft_config` is the one reader of what vLLM reads from a draft config
(every draft format eyas reads goes through it); `check_draft_config` refuses a config vLLM
would silently mis-read. What the aux ids mean is eyas/conventions/vllm.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from eyas.conventions import family
from eyas.conventions.rules import VLLM_V1, read_ids
from eyas.conventions.vllm import (
    AUX_IDS_KEY,
    EMBEDDING_CRASH,
    crashes_on_embedding,
    default_ids,
    to_ids,
)
from eyas.layout import HiddenStateLayout, LayoutError

DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
DRAFT_ARCHITECTURES = (DRAFT_ARCHITECTURE, "Eagle3LlamaForCausalLM")  # both map to one class
DRAFT_WEIGHTS_FILE = "model.safetensors"
# Draft hyper-parameters, written under these config.json keys (eyas.draft.eagle3.model.Eagle3Config's
# field names).
DRAFT_HYPER_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "rms_norm_eps", "max_position_embeddings", "vocab_size",
                    "draft_vocab_size", "target_hidden_size", "num_aux_hidden_states",
                    "hidden_act", "rope_parameters")
# deepseek_eagle3.py: the same layer around multi-head latent attention (DeepSeek/Kimi drafts),
# its ranks and head dims under these keys; eyas reads such drafts (it trains Llama ones)
MLA_DRAFT_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
DRAFT_INDEX_DTYPES = {"d2t": "int64", "t2d": "bool"}  # the other tensors are in the model dtype
# llama_eagle3.py's normalisation options (eyas.draft.eagle3.model says what each computes). vLLM
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
              AUX_IDS_KEY: list(ids),
              "eagle_config": {AUX_IDS_KEY: list(ids),
                               "use_aux_hidden_state": True,
                               "norm_before_fc": bool(hyper.get("norm_before_fc", False))}}
    if "rope_theta" in hyper["rope_parameters"]:  # mirrored for readers older than rope_parameters
        config["rope_theta"] = hyper["rope_parameters"]["rope_theta"]
    return config


# -- P-EAGLE: the same class with vLLM's parallel drafting (speculative_config
# parallel_drafting: true; v1/spec_decode/llm_base_proposer.py) ---------------------------
# The mask positions' hidden input, [n_aux * target_hidden] (vLLM views it as [1, -1] and
# passes it through combine_hidden_states: the fc norms, then fc)
MASK_HIDDEN = "mask_hidden"
# where vLLM's proposer reads the mask token id, in its order: dflash_config.mask_token_id,
# then `mask_token_id` (when not null), then the first of these keys present
MASK_TOKEN_KEY = "mask_token_id"
OTHER_MASK_TOKEN_KEYS = ("dspark_noise_token_id", "pard_token", "ptd_token_id")


def read_mask_token_id(config: dict) -> int | None:
    """The mask token id vLLM 0.32's parallel drafter reads from a draft config.json (None:
    none, and vLLM refuses to boot it with parallel drafting)."""
    dflash = config.get("dflash_config") or {}
    if "mask_token_id" in dflash:
        return int(dflash["mask_token_id"])
    if config.get(MASK_TOKEN_KEY) is not None:
        return int(config[MASK_TOKEN_KEY])
    for key in OTHER_MASK_TOKEN_KEYS:
        if key in config:
            return int(config[key])
    return None


def later_layer_shapes(hyper: dict, i: int) -> dict[str, tuple[int, ...]]:
    """Layer i >= 1 of a multi-layer llama_eagle3 draft (`layers.{i}.*`): a plain Llama layer,
    attention H wide (layer 0 alone reads [embeds, hidden], 2H, and has hidden_norm)."""
    h, inter = hyper["hidden_size"], hyper["intermediate_size"]
    q, kv = (hyper["num_attention_heads"] * hyper["head_dim"],
             hyper["num_key_value_heads"] * hyper["head_dim"])
    shapes = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
              "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
              "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
              "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
              "mlp.down_proj.weight": (h, inter)}
    return {f"layers.{i}.{k}": v for k, v in shapes.items()}


def peagle_weight_shapes(hyper: dict) -> dict[str, tuple[int, ...]]:
    """A P-EAGLE draft's tensors: EAGLE-3's (layer 0 as `midlayer.*`), `layers.{i}.*` for
    i in 1..num_layers-1, and `mask_hidden`."""
    shapes = dict(draft_weight_shapes(hyper))
    for i in range(1, int(hyper.get("num_layers", 1))):
        shapes.update(later_layer_shapes(hyper, i))
    shapes[MASK_HIDDEN] = (hyper["num_aux_hidden_states"] * hyper["target_hidden_size"],)
    return shapes


def peagle_draft_config(hyper: dict, layout: HiddenStateLayout, dtype: str,
                        version: str | None = None) -> dict:
    """config.json of a P-EAGLE draft: EAGLE-3's (`draft_config`) with its layer count and
    `mask_token_id`. Parallel drafting itself is asked for in vLLM's speculative config
    (vLLM reads `parallel_drafting` from a draft config only in the speculators format)."""
    config = draft_config(hyper, layout, dtype, version)
    config["num_hidden_layers"] = int(hyper.get("num_layers", 1))
    config[MASK_TOKEN_KEY] = int(hyper[MASK_TOKEN_KEY])
    return config


def rope_parameters(config) -> dict:
    """RoPE as transformers 5 reads it from a config.json dict or an HF config object:
    `rope_parameters`, else (configs written before it) `rope_theta` (default 10000) with
    `rope_scaling`; a rope type spelt `type` (DeepSeek's configs) becomes `rope_type`."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    rope = get("rope_parameters") or {"rope_type": "default",
                                      "rope_theta": float(get("rope_theta", 10000.0)),
                                      **(get("rope_scaling") or {})}
    if "type" in rope:
        rope = {**{k: v for k, v in rope.items() if k != "type"}, "rope_type": rope["type"]}
    return dict(rope)


@dataclass(frozen=True)
class VllmView:
    """What vLLM 0.32 reads from a draft config.json (an empty id list counts as none)."""
    top_ids: list[int] | None  # top-level eagle_aux_hidden_state_layer_ids: what it captures
    nested_ids: list[int] | None  # eagle_config's: captured when there is no top-level list
    num_aux_key: int | None  # num_aux_hidden_states: sizes fc first
    use_aux: bool = True  # eagle_config.use_aux_hidden_state
    options: dict = field(default_factory=dict)  # NORM_OPTIONS -> bool (read_norm_options)
    # DRAFT_HYPER_KEYS, with the defaults transformers' LlamaConfig gives an absent key (None
    # where it gives none); num_aux_hidden_states is what fc is sized for
    hyper: dict = field(default_factory=dict)
    captured: list[int] | None = None  # what the CPU build's (V1) runner captures: rules.py
    config: dict = field(default_factory=dict)  # the config.json it read

    @property
    def ids(self) -> list[int] | None:
        """The ids the target captures on vLLM's V1 runner (None: none, so its default); the
        V2 runner's are eyas.conventions.rules.read_ids(VLLM_V2, config)'s."""
        return self.captured


def _ids(value) -> list[int] | None:
    return [int(i) for i in value] if value else None


def read_draft_config(config: dict) -> VllmView:
    """A draft config.json as vLLM 0.32 reads it (llama_eagle3.py, config/speculative.py; the
    ids as its V1 runner reads them, eyas/conventions/rules.py): the target captures the
    top-level ids, else eagle_config's, else the default (2, N//2, N-3); fc is sized from
    num_aux_hidden_states, else the length of eagle_config's list, else 3."""
    eagle = config.get("eagle_config") or {}
    top, nested = _ids(config.get(AUX_IDS_KEY)), _ids(eagle.get(AUX_IDS_KEY))
    num_aux = config.get("num_aux_hidden_states")
    num_aux = None if num_aux is None else int(num_aux)
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    hyper = {
        "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or (hidden // heads if hidden and heads else None),
        "intermediate_size": config.get("intermediate_size"),
        "rms_norm_eps": config.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": config.get("max_position_embeddings", 2048),
        "vocab_size": config.get("vocab_size"), "draft_vocab_size": config.get("draft_vocab_size"),
        "target_hidden_size": config.get("target_hidden_size") or hidden,
        "num_aux_hidden_states": (num_aux if num_aux is not None else
                                  len(nested) if nested else 3),
        "hidden_act": config.get("hidden_act", "silu"), "rope_parameters": rope_parameters(config)}
    return VllmView(top, nested, num_aux, eagle.get("use_aux_hidden_state", True) is not False,
                    read_norm_options(config), hyper, read_ids(VLLM_V1, config).capture, config)


# -- checks before a boot: where vLLM 0.32 would silently mis-read a draft config ----------
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
      ids only under eagle_config    -> refused: the CPU build's V1 runner captures them, but
                                        a GPU's V2 runner never reads that key (its default)
      no ids                         -> refused: vLLM would use (2, 2, 1) -> [1, 2], 2 states
      [4, 0, 2]                      -> refused: vLLM concatenates ascending, [0, 2, 4]
    """
    n = target_num_layers
    fam = family(target_architecture)
    view = read_draft_config(draft_config)
    top, nested = view.top_ids or [], view.nested_ids or []
    if not top and not nested:
        dflt = default_ids(n)
        used = sorted(set(dflt)) if fam != "deepseek" else list(dflt)
        note = (f", only {len(used)} distinct where fc expects 3 (the first decode step would "
                "crash)" if len(used) < 3 else "")
        raise LayoutError(
            f"{source}: no {AUX_IDS_KEY} (top-level or under eagle_config). vLLM would use its "
            f"default ids {dflt} for a {n}-block target -> {used}{note}; which slots the draft "
            "was trained on is unknown. Write the layout's vLLM ids in both places")
    if nested and not top:
        raise LayoutError(
            f"{source}: {AUX_IDS_KEY} {nested} only under eagle_config. vLLM's V1 runner (its "
            "CPU build) captures those, but its V2 runner (a CUDA GPU's default) never reads "
            f"that key and feeds its default {list(default_ids(n))} (eyas/conventions/rules.py)"
            ". Write the ids at the top level too")
    if top and not nested:
        raise LayoutError(
            f"{source}: {AUX_IDS_KEY} {top} only at top level. vLLM captures those, but sizes "
            "the draft's fc from num_aux_hidden_states, else from eagle_config's list, else 3; "
            "SGLang reads only eagle_config. Write the ids under eagle_config too")
    if top and nested and top != nested:
        raise LayoutError(
            f"{source}: top-level {AUX_IDS_KEY} {top} (what vLLM captures) differs from "
            f"eagle_config's {nested} (what sizes vLLM's fc and what SGLang reads)")
    ids = view.ids
    if not view.use_aux:
        raise LayoutError(f"{source}: eagle_config.use_aux_hidden_state is false, so vLLM feeds "
                          f"the draft no aux states at all, though it names ids {ids}")
    num_aux = view.num_aux_key
    if num_aux is not None and num_aux != len(ids):
        raise LayoutError(f"{source}: num_aux_hidden_states={num_aux} sizes fc for {num_aux} "
                          f"states, but the ids {ids} capture {len(ids)}")
    bad = [i for i in ids if not 0 <= i <= n]
    if bad:
        raise LayoutError(f"{source}: ids {bad} out of range 0..{n} for a {n}-block target "
                          "(vLLM id k = input of block k; N = the last block's pre-norm output)")
    if crashes_on_embedding(target_architecture, ids):
        raise LayoutError(f"{source}: {EMBEDDING_CRASH}")
    if ids != sorted(set(ids)):  # Llama sorts them; DeepSeek captures in layer order
        raise LayoutError(
            f"{source}: ids {ids} are not ascending and distinct; vLLM captures sorted(set(ids))"
            f" = {sorted(set(ids))} and concatenates in that order, not the written one")
    drafts_target_hidden, vocab = view.hyper["target_hidden_size"], view.hyper["vocab_size"]
    if target_hidden_size is not None and drafts_target_hidden != target_hidden_size:
        raise LayoutError(f"{source}: target_hidden_size {drafts_target_hidden} but the target's "
                          f"hidden size is {target_hidden_size}")
    if target_vocab_size is not None and vocab != target_vocab_size:
        raise LayoutError(f"{source}: vocab_size {vocab} but the target's vocab is "
                          f"{target_vocab_size} (d2t maps into the target's vocab)")
    draft_vocab = view.hyper["draft_vocab_size"]
    if draft_vocab is not None and vocab is not None and int(draft_vocab) > int(vocab):
        raise LayoutError(f"{source}: draft_vocab_size {draft_vocab} > vocab_size {vocab}")
    return ids
