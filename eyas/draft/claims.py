"""What every draft-format reader shares: the claims a config makes, and the model's constructor
arguments (eyas.draft.eagle3.model.Eagle3Config's fields, normalisation options included,
as the engine will apply them) converted once from what vLLM reads of a config
(eyas.conventions.vllm_checkpoint.read_draft_config) and the weights' shapes; weights of an option
the engine would not apply are refused (it would serve another function than the one trained)."""
from __future__ import annotations

from dataclasses import dataclass, field

from eyas.conventions.vllm_checkpoint import (
    DRAFT_HYPER_KEYS,
    NORM_OPTIONS,
    VllmView,
    draft_weight_shapes,
)
from eyas.layout import HiddenStateLayout, LayoutError, Slot, TargetIdentity

_OPTION_WEIGHTS = {"input_norm.": "norm_before_fc", "fc_norm.": "fc_norm"}


class FormatError(LayoutError):
    """A draft eyas cannot read as the function its engine would serve."""


@dataclass
class Claims:
    """What a draft's files say, and what they leave unknown (None, never guessed)."""
    format: str  # "eyas" | "eagle3" | "eagle3-mla" | "speculators" | "specforge"
    model_args: dict  # Eagle3Config's fields; num_aux_hidden_states from fc's width
    view: VllmView  # what vLLM reads from the config (a speculators config: after conversion)
    layout: HiddenStateLayout | None  # the slots the config says it was trained on; None: unknown
    says: str  # how the config says it, in words
    has_d2t: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def num_aux(self) -> int:
        return int(self.model_args["num_aux_hidden_states"])


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


def model_args_from(config: dict, view: VllmView, shapes: dict, target: TargetIdentity,
                    source: str, mla: dict | None = None) -> dict:
    """Eagle3Config fields from what vLLM reads of a flat Llama-style config (`view`: its norm
    options and hyper-parameters) and the weights' shapes. `mla`: the attention is multi-head
    latent attention with these ranks and head dims (formats.mla)."""
    options = view.options
    check_option_weights(options, shapes, source)
    for key, value in (("num_hidden_layers", 1), ("attention_bias", False),
                       ("mlp_bias", False)):
        if config.get(key, value) != value:
            raise FormatError(f"{source}: {key}={config[key]}; eyas's draft model is one "
                              f"decoder layer without biases (needs {key}={value})")
    if "fc.weight" not in shapes or "lm_head.weight" not in shapes:
        raise FormatError(f"{source}: the weights lack fc.weight or lm_head.weight "
                          f"(found {sorted(shapes)[:12]}); not an EAGLE-3 draft")
    said = view.hyper
    hidden = said["hidden_size"] or shapes["fc.weight"][0]
    target_hidden = said["target_hidden_size"] or hidden  # vLLM's default
    width = shapes["fc.weight"][1]
    if width % target_hidden:
        raise FormatError(f"{source}: fc.weight takes {width} inputs, not a multiple of "
                          f"target_hidden_size {target_hidden}")
    if target_hidden != target.hidden_size:
        raise FormatError(f"{source}: the draft reads states of width {target_hidden}, the "
                          f"target's hidden size is {target.hidden_size}: a draft for another "
                          "target")
    heads = said["num_attention_heads"]
    args = {
        **said, "hidden_size": hidden,
        "num_key_value_heads": heads if mla else said["num_key_value_heads"],
        "head_dim": (mla["qk_rope_head_dim"] if mla else  # MLA: the RoPE part's width
                     said["head_dim"] or (hidden // heads if heads else None)),
        "intermediate_size": (said["intermediate_size"]
                              or shapes.get("midlayer.mlp.down_proj.weight", (0, None))[1]),
        "draft_vocab_size": shapes["lm_head.weight"][0],
        "target_hidden_size": target_hidden, "num_aux_hidden_states": width // target_hidden,
        **{k: bool(options.get(k, False)) for k in NORM_OPTIONS}}
    if mla:
        args["mla"] = dict(mla)
    missing = [k for k in DRAFT_HYPER_KEYS if args.get(k) is None]
    if missing:
        raise FormatError(f"{source}: the config lacks {missing}")
    written = said["draft_vocab_size"]
    if written is not None and int(written) != args["draft_vocab_size"]:
        raise FormatError(f"{source}: draft_vocab_size {written} but lm_head.weight has "
                          f"{args['draft_vocab_size']} rows")
    expected = dict(draft_weight_shapes(args), **{"embed_tokens.weight": None})
    unexpected = sorted(set(shapes) - set(expected))
    wrong = [f"{k} {shapes[k]} (expected {v})" for k, v in expected.items()
             if v is not None and k in shapes and tuple(shapes[k]) != v]
    lacking = sorted(k for k in expected if expected[k] and k not in shapes
                     and k not in ("d2t", "t2d"))
    if unexpected or wrong or lacking:
        raise FormatError(f"{source}: weights differ from a one-layer EAGLE-3 draft "
                          f"(unexpected {unexpected}, wrong shapes {wrong}, missing {lacking})")
    return args
