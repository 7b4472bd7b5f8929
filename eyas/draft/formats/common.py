"""What every draft-format reader shares: the claims a config makes, and the hyper-parameters
of eyas's `Eagle3Draft` (normalisation options included, as the engine will apply them) read
from a config and the weights' shapes; weights of an option the engine would not apply are
refused (it would serve another function than the one trained)."""
from __future__ import annotations

from dataclasses import dataclass, field

from eyas.engines.vllm_checkpoint import DRAFT_HYPER_KEYS, NORM_OPTIONS, draft_weight_shapes
from eyas.layout import HiddenStateLayout, LayoutError, Slot, TargetIdentity

AUX_IDS_KEY = "eagle_aux_hidden_state_layer_ids"
_OPTION_WEIGHTS = {"input_norm.": "norm_before_fc", "fc_norm.": "fc_norm"}


class FormatError(LayoutError):
    """A draft eyas cannot read as the function its engine would serve."""


@dataclass(frozen=True)
class VllmView:
    """The keys vLLM 0.32 reads from the config after its own conversion (a speculators
    config is rebuilt from transformer_layer_config plus a few copied keys)."""
    top_ids: list[int] | None  # top-level eagle_aux_hidden_state_layer_ids (None: absent/empty)
    nested_ids: list[int] | None  # eagle_config's
    num_aux_key: int | None  # num_aux_hidden_states (sizes fc first)
    use_aux: bool = True  # eagle_config.use_aux_hidden_state


@dataclass
class Claims:
    """What a draft's files say, and what they leave unknown (None, never guessed)."""
    format: str  # "eyas" | "eagle3" | "speculators" | "specforge"
    hyper: dict  # eyas.draft.model.Eagle3Config fields; num_aux_hidden_states from fc's width
    view: VllmView
    layout: HiddenStateLayout | None  # the slots the config says it was trained on; None: unknown
    says: str  # how the config says it, in words
    has_d2t: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def num_aux(self) -> int:
        return int(self.hyper["num_aux_hidden_states"])


def ids_or_none(value) -> list[int] | None:
    """An id list as engines read it: absent or empty means none."""
    return [int(i) for i in value] if value else None


def layout_from_stream(stream: list[int], target: TargetIdentity, source: str,
                       convention: str) -> HiddenStateLayout:
    """Slots at residual-stream positions (embed = 0, block_out:k = k + 1), in ascending order
    (every engine concatenates captured states in layer order)."""
    n = target.num_layers
    bad = [i for i in stream if not 0 <= i <= n]
    if bad:
        raise FormatError(f"{source}: ids read as {convention} point outside the {n}-block "
                          f"target (stream positions {bad}); is this draft for another target?")
    slots = tuple(Slot.at_stream_index(i, n) for i in sorted(set(stream)))
    return HiddenStateLayout(target, slots, Slot("block_out", n - 1))


def claimed_from_vllm_ids(ids: list[int] | None, num_aux: int, target: TargetIdentity,
                          source: str, notes: list[str]) -> HiddenStateLayout | None:
    """The layout a vLLM-convention id list claims (id k = input of layer k), or None.

    A list one longer than fc whose last id is N (speculators' launch_vllm captures
    [2, N//2, N-3, N], the last for the verifier) claims its first entries."""
    if ids is None:
        return None
    n = target.num_layers
    if len(set(ids)) == num_aux + 1 and max(ids) == n:
        notes.append(f"the id list {ids} has one entry more than fc takes ({num_aux}) and ends "
                     f"with {n}, the verifier's state (speculators' launch_vllm capture list): "
                     f"the draft inputs are read as {sorted(set(ids))[:-1]}")
        ids = sorted(set(ids))[:-1]
    if len(set(ids)) != num_aux:
        notes.append(f"the id list {ids} names {len(set(ids))} distinct states but fc takes "
                     f"{num_aux}: what the draft was trained on is unknown")
        return None
    return layout_from_stream(ids, target, source, "vLLM ids (input of layer k)")


def check_option_weights(options: dict, shapes: dict, source: str) -> None:
    """Refuse weights of a norm option the config leaves off: vLLM drops `input_norm.*`
    without norm_before_fc (and builds no fc_norm without fc_norm), so it would serve the draft
    without the norm it was trained with."""
    for prefix, option in _OPTION_WEIGHTS.items():
        if any(name.startswith(prefix) for name in shapes) and not options.get(option):
            raise FormatError(
                f"{source}: the weights hold {prefix}* but the config leaves {option} off, so "
                f"vLLM would drop them and serve another function than the one trained; "
                f"write \"{option}\": true in config.json")


def hyper_from(config: dict, shapes: dict, target: TargetIdentity, source: str,
               options: dict, mla: dict | None = None) -> dict:
    """Eagle3Config fields from a flat Llama-style config, the norm options as the engine
    reads them (NORM_OPTIONS -> bool) and the weights' shapes. `mla`: the attention is
    multi-head latent attention with these ranks and head dims (formats.mla)."""
    check_option_weights(options, shapes, source)
    for key, value in (("num_hidden_layers", 1), ("attention_bias", False),
                       ("mlp_bias", False)):
        if config.get(key, value) != value:
            raise FormatError(f"{source}: {key}={config[key]}; eyas's draft model is one "
                              f"decoder layer without biases (needs {key}={value})")
    if "fc.weight" not in shapes or "lm_head.weight" not in shapes:
        raise FormatError(f"{source}: the weights lack fc.weight or lm_head.weight "
                          f"(found {sorted(shapes)[:12]}); not an EAGLE-3 draft")
    hidden = config.get("hidden_size") or shapes["fc.weight"][0]
    target_hidden = config.get("target_hidden_size") or hidden  # vLLM's default
    width = shapes["fc.weight"][1]
    if width % target_hidden:
        raise FormatError(f"{source}: fc.weight takes {width} inputs, not a multiple of "
                          f"target_hidden_size {target_hidden}")
    if target_hidden != target.hidden_size:
        raise FormatError(f"{source}: the draft reads states of width {target_hidden}, the "
                          f"target's hidden size is {target.hidden_size}: a draft for another "
                          "target")
    heads = config.get("num_attention_heads")
    rope = config.get("rope_parameters") or {
        "rope_type": "default", "rope_theta": float(config.get("rope_theta", 10000.0)),
        **(config.get("rope_scaling") or {})}
    if "type" in rope:  # DeepSeek's configs name the rope type "type"
        rope = {**{k: v for k, v in rope.items() if k != "type"}, "rope_type": rope["type"]}
    hyper = {
        "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": heads if mla else config.get("num_key_value_heads") or heads,
        "head_dim": (mla["qk_rope_head_dim"] if mla else  # MLA: the RoPE part's width
                     config.get("head_dim") or (hidden // heads if heads else None)),
        "intermediate_size": (config.get("intermediate_size")
                              or shapes.get("midlayer.mlp.down_proj.weight", (0, None))[1]),
        "rms_norm_eps": config.get("rms_norm_eps", 1e-6),  # LlamaConfig's default
        "max_position_embeddings": config.get("max_position_embeddings", 2048),
        "vocab_size": config.get("vocab_size"),
        "draft_vocab_size": shapes["lm_head.weight"][0],
        "target_hidden_size": target_hidden, "num_aux_hidden_states": width // target_hidden,
        "hidden_act": config.get("hidden_act", "silu"), "rope_parameters": dict(rope),
        **{k: bool(options.get(k, False)) for k in NORM_OPTIONS}}
    if mla:
        hyper["mla"] = dict(mla)
    missing = [k for k in DRAFT_HYPER_KEYS if hyper.get(k) is None]
    if missing:
        raise FormatError(f"{source}: the config lacks {missing}")
    written = config.get("draft_vocab_size")
    if written is not None and int(written) != hyper["draft_vocab_size"]:
        raise FormatError(f"{source}: draft_vocab_size {written} but lm_head.weight has "
                          f"{hyper['draft_vocab_size']} rows")
    expected = dict(draft_weight_shapes(hyper), **{"embed_tokens.weight": None})
    unexpected = sorted(set(shapes) - set(expected))
    wrong = [f"{k} {shapes[k]} (expected {v})" for k, v in expected.items()
             if v is not None and k in shapes and tuple(shapes[k]) != v]
    lacking = sorted(k for k in expected if expected[k] and k not in shapes
                     and k not in ("d2t", "t2d"))
    if unexpected or wrong or lacking:
        raise FormatError(f"{source}: weights differ from a one-layer EAGLE-3 draft "
                          f"(unexpected {unexpected}, wrong shapes {wrong}, missing {lacking})")
    return hyper
