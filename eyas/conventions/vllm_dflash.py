"""The DFlash draft vLLM 0.32 loads (`method: "dflash"`, model_executor/models/qwen3_dflash.py
`DFlashQwen3ForCausalLM`): its config keys, its weight names and its id convention live here
and nowhere else (eyas/draft/dflash/ writes and reads drafts through this module).

Ids. `dflash_config.target_layer_ids` k names the OUTPUT of target layer k: vLLM adds the
shift that eyas/conventions/rules.py records for that key (+1, in both runners) and captures
the residual stream there, so k = N-1 is the last layer's output before the final norm.
In eyas's slots (eyas.layout): block_out:K -> K, final_prenorm -> N-1; `embed` would be -1,
which no DFlash config can say. Worked example, a 4-block target:
    [block_out:0, block_out:2, final_prenorm] -> target_layer_ids [0, 2, 3]
    vLLM captures stream positions [1, 3, 4] (HF hidden_states[1], [3], and block 3's pre-norm
    output). Written as stream indices [1, 3, 4] instead (EAGLE-3's convention), vLLM would
    feed [block_out:1, block_out:3, out of range]: the classic DFlash off-by-one.
The ids are written only under dflash_config: vLLM sizes fc from the V2 rule's ids
(qwen3_dflash.py `_get_dflash_fc_input_size`) in both runners, and an `eagle_config` dict
would replace what the V1 runner captures (rules.VLLM_V1), so eyas writes neither
`eagle_config` nor a top-level id list.

Tensors (qwen3_dflash.py `load_weights`: everything but lm_head/d2t is under `model.`):
    fc.weight                     [H, n_ids*H_target]
    hidden_norm.weight, norm.weight  [H]
    layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight  [H]
    layers.{i}.self_attn.{q,k,v}_proj.weight  [heads*d | kv*d, H]   (input H, not 2H)
    layers.{i}.self_attn.o_proj.weight        [H, heads*d]
    layers.{i}.self_attn.{q,k}_norm.weight    [d]
    layers.{i}.mlp.{gate,up}_proj.weight [I, H], down_proj [H, I]
    lm_head.weight [draft_vocab, H]; d2t int64 [draft_vocab] (offsets) only with a reduced
    vocabulary (vLLM has no parameter for it otherwise); t2d is skipped by vLLM.
No embed_tokens: vLLM shares the target's.
"""
from __future__ import annotations

from eyas.conventions import vllm
from eyas.conventions.rules import DFLASH_IDS_PATH as IDS_PATH, VLLM_RUNNERS, read_ids
from eyas.layout import EMBED, FINAL_NORM, HiddenStateLayout, LayoutError, Slot

ARCHITECTURE = "DFlashDraftModel"  # the registry maps it to DFlashQwen3ForCausalLM
MODEL_TYPE = "qwen3"
# the draft kinds (eyas.draft.spec) vLLM serves with this model: it reads dflash_config.causal,
# and without ids sizes fc from the draft's num_hidden_layers
KINDS = frozenset({"dflash"})
# block-drafting kinds vLLM 0.32 serves in fewer runners: {kind: (its runners, why not others)}
OTHER_BLOCK_KINDS = {"domino": ((), "vLLM 0.32's registry has no Domino draft model"),
                     "dspark": (("V2",), "DSpark exists only in the V2 runner (a GPU)")}
# DFlashConfig's fields written as config.json keys of the same name (Qwen3Config's)
HYPER_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "rms_norm_eps", "max_position_embeddings", "vocab_size",
              "draft_vocab_size", "target_hidden_size", "num_hidden_layers", "hidden_act",
              "rope_parameters")


def not_served_by(kind: str, runner: str) -> str | None:
    """Why vLLM 0.32's `runner` ("V1" | "V2") does not serve drafts of block kind `kind`
    (OTHER_BLOCK_KINDS); None where it may."""
    runners, why = OTHER_BLOCK_KINDS.get(kind, (None, ""))
    return why if runners is not None and runner not in runners else None


def _shift() -> int:
    """What vLLM adds to a target_layer_ids entry (rules.py, both runners)."""
    shifts = {k.shift for r in VLLM_RUNNERS for k in r.keys if k.path == IDS_PATH}
    if len(shifts) != 1:
        raise LayoutError(f"vLLM's runners shift {IDS_PATH} differently ({shifts}); "
                          "eyas/conventions/rules.py must say one")
    return shifts.pop()


def written(stream: list[int]) -> list[int]:
    """Stream positions vLLM captures -> the target_layer_ids that make it capture them."""
    return [i - _shift() for i in stream]


def to_layer_ids(layout: HiddenStateLayout) -> list[int]:
    """The layout's draft inputs as `target_layer_ids` (see the module docstring)."""
    names = layout.names
    if EMBED in layout.draft_inputs:
        raise LayoutError(
            f"layout {names}: a DFlash draft cannot be fed the embedding output: vLLM reads "
            f"{IDS_PATH} as outputs of layers (it adds {_shift()}), so no id names the "
            "embedding. Extract block slots only, e.g. extract.layout.draft_inputs="
            f"[block_out:0,...,final_prenorm], or train an eagle3 draft on this layout")
    if FINAL_NORM in layout.draft_inputs:
        raise LayoutError(f"layout {names}: vLLM captures the residual stream before the final "
                          "norm; final_norm cannot be fed to a DFlash draft (use final_prenorm)")
    return written(vllm.to_ids(layout))  # ascending, as vLLM concatenates


def captured(config: dict) -> dict[str, list[int] | None]:
    """Per vLLM runner label, the stream positions it captures for this config (None: its
    default)."""
    return {r.label: read_ids(r, config).capture for r in VLLM_RUNNERS}


def read_capture(config: dict, num_layers: int, source: str) -> list[int]:
    """The stream positions vLLM captures for a DFlash config.json and feeds fc, in order;
    LayoutError where vLLM's runners would read it differently from what it says, or where
    the ids fall outside the target."""
    reads = captured(config)
    if len({tuple(v) if v else None for v in reads.values()}) != 1:
        raise LayoutError(f"{source}: vLLM's runners read different ids from it ({reads}); "
                          f"write the ids only in {IDS_PATH} (no eagle_config, no top-level "
                          "list), as eyas does")
    stream = next(iter(reads.values()))
    if not stream:
        raise LayoutError(f"{source}: no {IDS_PATH}: vLLM would feed its default layers; "
                          "which slots the draft was trained on is unknown")
    ids = written(stream)
    bad = [i for i, s in zip(ids, stream) if not 1 <= s <= num_layers]
    if bad:
        raise LayoutError(
            f"{source}: {IDS_PATH} {ids} has {bad} outside 0..{num_layers - 1} for a "
            f"{num_layers}-block target (id k = output of layer k; vLLM adds {_shift()}). Ids "
            "written as stream indices (EAGLE-3's input-of-layer convention) are one too "
            "high: subtract 1")
    if stream != sorted(set(stream)):
        raise LayoutError(f"{source}: {IDS_PATH} {ids} are not ascending and distinct; "
                          f"vLLM concatenates {sorted(set(ids))} in ascending order")
    return stream


def slots_fed(stream: list[int], num_layers: int) -> list[str]:
    return [Slot.at_stream_index(i, num_layers).name for i in stream]


def draft_config(args: dict, layout: HiddenStateLayout, dtype: str) -> dict:
    """config.json of a DFlash draft vLLM loads unmodified (`args`: DFlashConfig's fields)."""
    ids = to_layer_ids(layout)
    layout.expect_draft_inputs(args["num_aux_hidden_states"], "the draft's fc")
    missing = [k for k in (*HYPER_KEYS, "mask_token_id", "block_size") if k not in args]
    if missing:
        raise ValueError(f"DFlash draft arguments lack {missing}")
    config = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
              **{k: args[k] for k in HYPER_KEYS},
              "attention_bias": False, "tie_word_embeddings": False,
              "torch_dtype": dtype, "dtype": dtype,
              # the block it was trained on, where the published DFlash configs (SpecForge,
              # z-lab) keep it: vLLM never reads it, the doctor does (num_speculative_tokens =
              # block_size - 1), and so does the reference's own model code
              "block_size": int(args["block_size"]),
              # every layer full, non-causal attention (qwen3_dflash.py _resolve_layer_attention)
              "use_sliding_window": False,
              # causal stated, not left to vLLM's fallback (served_causal below,
              # _dflash_layer_causal: is_causal, dflash_config.causal, layer_types): eyas trains
              # every block non-causally (eyas/draft/dflash/model.py)
              "dflash_config": {"mask_token_id": int(args["mask_token_id"]),
                                "target_layer_ids": ids, "causal": False}}
    if "rope_theta" in args["rope_parameters"]:  # readers older than rope_parameters
        config["rope_theta"] = args["rope_parameters"]["rope_theta"]
    return config


def weight_shapes(args: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor a DFlash draft's weights file holds, with its shape (module docstring)."""
    h, inter, d = args["hidden_size"], args["intermediate_size"], args["head_dim"]
    q, kv = args["num_attention_heads"] * d, args["num_key_value_heads"] * d
    shapes = {"fc.weight": (h, args["num_aux_hidden_states"] * args["target_hidden_size"]),
              "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(args["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter)})
    shapes["lm_head.weight"] = (args["draft_vocab_size"], h)
    if args["draft_vocab_size"] != args["vocab_size"]:
        shapes.update({"d2t": (args["draft_vocab_size"],), "t2d": (args["vocab_size"],)})
    return shapes


def served_causal(config: dict) -> tuple[list[bool], str]:
    """Per draft layer, whether vLLM 0.32 runs a DFlash draft's attention causally, and from
    which key (qwen3_dflash.py `_dflash_layer_causal`: is_causal, else dflash_config.causal,
    else a layer_types entry of sliding_attention, else non-causal)."""
    n = int(config.get("num_hidden_layers") or 1)
    if config.get("is_causal") is not None:
        return [bool(config["is_causal"])] * n, "is_causal"
    causal = (config.get("dflash_config") or {}).get("causal")
    if causal is not None:
        return [bool(causal)] * n, "dflash_config.causal"
    types = config.get("layer_types") or []
    if types:
        return [t == "sliding_attention" for t in types[:n]], "layer_types"
    return [False] * n, "no is_causal, dflash_config.causal or layer_types: the default"
