"""SGLang: ids read ONLY from the draft config's `eagle_config.eagle_aux_hidden_state_layer_ids`
(a top-level key is ignored and the default [2, N//2, N-3] then applies raw).

Read in SGLang's source (models/llama.py, models/deepseek_v2.py, 0.5.x):
- Llama family: id k is the OUTPUT of layer k (it captures at the input of layer k+1);
  -1 is the embedding output; id N-1 (the last block) is never captured, silently. Captured
  in ascending layer order.
- DeepSeek-V2 family, since 0.5.13 (PR "drop +1 offset on aux layer ids when first id != 1",
  verified in 0.5.23): +1 only when the FIRST id is 1, otherwise ids are raw inputs of layers
  (0 = embedding). -1 matches nothing (a slot silently missing). Up to 0.5.12: always +1.

Draft normalisation options (models/llama_eagle3.py, read in every release 0.5.10..0.5.23):
`fc_norm` and `norm_output` are applied from 0.5.12 (top-level keys), `norm_before_fc` from
0.5.17 (eagle_config first, then top level; SGLang PR 32334), `norm_before_residual` in none
(never read). Before that an option is ignored without a word and its weights (`input_norm.*`,
`fc_norm.*`) are dropped by the loader: SGLang would serve another function than the trained.

gpt-oss (models/gpt_oss.py): ids used raw when the largest is N, otherwise +1 (read in 0.5.23).

Every version is checked, whatever the family: only versions whose model code was read are
accepted (docs/engines.md lists them and what was read). None means the newest verified.

Worked example, a 60-layer target whose draft was trained on [embed, block_out:2, block_out:30]
(the embedding slot that vLLM's default ids and SpecForge's cannot express):
  Llama rule                 -> [-1, 2, 30]
  DeepSeek rule (>= 0.5.13)  -> [0, 3, 31]   (first id 0, so used raw)
  DeepSeek rule (<= 0.5.12)  -> refused: embedding not capturable
"""
from __future__ import annotations

import re

from eyas.conventions import UnverifiedVersion, family
from eyas.conventions.vllm import AUX_IDS_KEY
from eyas.layout import EMBED, FINAL_NORM, HiddenStateLayout, LayoutError, Slot, eagle3_default_ids

VERIFIED = "0.5.23"
FC_SLOTS = 3  # its llama_eagle3 sizes fc as 3 x the target's hidden size, whatever the config
# the draft kinds (eyas.draft.spec) whose SGLang support eyas has read
READ_KINDS = frozenset({"eagle3", "eagle3.1", "mla-eagle3", "dflash", "dspark"})

# DFlash in SGLang 0.5.23: ids from dflash_config.target_layer_ids, else the top-level
# target_layer_ids (speculative/dflash_utils.py parse_dflash_draft_config); none at all ->
# build_target_layer_ids(N, the draft's num_hidden_layers); an empty list or an id outside
# [0, N) is a ValueError; the target's hook captures id k at the input of layer k+1. A target
# whose model class lacks `set_dflash_layers_to_capture` is refused at startup
# (model_runner_components/attention_backend_setup.py). These architectures have it
# (docs/scripts/sglang_dflash_hooks.py, read in the 0.5.23 wheel):
DFLASH_CAPTURE = frozenset({
    "BeamForCausalLM", "Cosmos3ForConditionalGeneration", "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration",
    "Glm4MoeLiteForCausalLM", "Glm5NextForConditionalGeneration", "GlmMoeDsaForCausalLM",
    "GptOssForCausalLM", "IQuestCoderForCausalLM", "InklingForConditionalGeneration",
    "InternLM3ForCausalLM", "InternS1ProForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "KimiK3LinearForCausalLM", "LagunaForCausalLM", "Lfm2BidirectionalModel",
    "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration",
    "Llama4ForCausalLM", "LlamaForCausalLM", "MellumForCausalLM", "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM", "MiniMaxM3SparseForConditionalGeneration", "Ministral3ForCausalLM",
    "MistralForCausalLM", "MistralLarge3ForCausalLM", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
    "NanbeigeForCausalLM", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2", "NemotronH_Omni_Reasoning_V3",
    "Phi3ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM",
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "TeleFLMForCausalLM",
})


def dflash_default_ids(num_target_layers: int, draft_layers: int) -> list[int]:
    """SGLang's default DFlash ids (dflash_utils.py build_target_layer_ids): one draft layer
    reads layer N//2; more spread evenly from layer 1 to N-3, rounded. E.g. N=36, 5 layers ->
    [1, 9, 17, 25, 33]."""
    if num_target_layers < 4 and draft_layers > 1:
        raise LayoutError(f"SGLang's default DFlash ids need a target of 4 layers or more, "
                          f"not {num_target_layers}")
    if draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 3 - 1
    return [int(round(1 + i * span / (draft_layers - 1))) for i in range(draft_layers)]
_LLAMA_VERIFIED = {(0, 5, 23)}  # models/llama.py read in these releases
_DEEPSEEK_RAW_SINCE = (0, 5, 13)  # first release after the May 2026 change (by date)
_DEEPSEEK_VERIFIED = {(0, 5, 23)}


# the first release that applies each option; None: no release does
OPTION_SINCE = {"fc_norm": (0, 5, 12), "norm_output": (0, 5, 12), "norm_before_fc": (0, 5, 17),
                "norm_before_residual": None}


def ignored_options(options: dict, version: str | None = None) -> list[str]:
    """The options on in `options` (name -> bool) that SGLang `version` silently ignores.

    E.g. {"norm_before_fc": True, "norm_output": True} -> 0.5.16: ["norm_before_fc"];
    0.5.23: [];  {"norm_before_residual": True} -> every version: ["norm_before_residual"].
    """
    v = _version(version)
    return [k for k, since in OPTION_SINCE.items() if options.get(k) and (since is None
                                                                          or v < since)]


def refuse_ignored_options(options: dict, version: str | None, where: str) -> None:
    ignored = ignored_options(options, version)
    if ignored:
        when = "; ".join(f"{k}: " + (f"applied from SGLang {'.'.join(map(str, OPTION_SINCE[k]))}"
                                     if OPTION_SINCE[k] else "applied by no SGLang release")
                         for k in ignored)
        raise LayoutError(
            f"{where}: trained with {', '.join(ignored)}, which SGLang "
            f"{version or VERIFIED} ignores without a word ({when}); it would serve another "
            "function than the one trained. Serve with vLLM, a newer SGLang, or train with "
            "those options off")


def _version(text: str | None) -> tuple[int, int, int]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", str(text or VERIFIED))
    if not match:
        raise LayoutError(f"SGLang version {text!r} is not of the form {VERIFIED}")
    return tuple(int(x) for x in match.groups())


def llama_rule(version: str | None) -> str:
    """The Llama-family rule (id k = output of layer k) for `version`; unread versions refused."""
    if _version(version) in _LLAMA_VERIFIED:
        return "output_of_layer"
    verified = ", ".join(".".join(map(str, v)) for v in sorted(_LLAMA_VERIFIED))
    raise UnverifiedVersion(
        f"SGLang {version}: its Llama-family capture rule has not been verified (verified: "
        f"{verified}). Export for the SGLang version you serve with if it is one of those; "
        "otherwise read that version's models/llama.py (layers_to_capture) and add it to "
        "eyas/conventions/sglang.py. Refusing to guess")


def deepseek_rule(version: str | None) -> str:
    v = _version(version)
    if v < _DEEPSEEK_RAW_SINCE:
        return "plus_one"
    if v in _DEEPSEEK_VERIFIED:
        return "raw_unless_first_is_1"
    raise UnverifiedVersion(
        f"SGLang {version}: its DeepSeek capture rule has not been verified (the +1 rule "
        f"changed in May 2026; verified: <= 0.5.12 always +1, {VERIFIED} raw unless the first "
        "id is 1). Read models/deepseek_v2.py and add it to eyas/conventions/sglang.py")


def rule(architecture: str, version: str | None) -> str:
    """The capture rule SGLang `version` applies to `architecture`; LayoutError when unverified."""
    fam = family(architecture, "sglang")
    if fam == "llama":
        return llama_rule(version)
    if fam == "gptoss":  # models/gpt_oss.py 1337-1352, read in 0.5.23 only
        llama_rule(version)  # the same versions read
        return "raw_if_last_is_n"
    return deepseek_rule(version)


def to_ids(layout: HiddenStateLayout, version: str | None = None) -> list[int]:
    n, names = layout.target.num_layers, layout.names
    rule_here = rule(layout.target.architecture, version)  # before anything else, every family
    streams = [None if s == FINAL_NORM else s.stream_index() for s in layout.draft_inputs]
    if None in streams:
        raise LayoutError(f"layout {names}: SGLang captures before the final norm; "
                          "final_norm cannot be fed to a draft")
    if n in streams:
        raise LayoutError(f"layout {names}: SGLang never captures block_out:{n - 1} (the last "
                          "block's output; config id N-1 is silently skipped); choose an "
                          "earlier block")
    if streams != sorted(streams):
        raise LayoutError(f"layout {names}: SGLang concatenates captured states in layer order; "
                          "this slot order cannot be expressed")
    if rule_here == "raw_if_last_is_n":
        raise LayoutError(f"layout {names}: eyas does not export for SGLang's gpt-oss rule "
                          "(ids raw only when the last is N); serve with vLLM")
    if rule_here == "output_of_layer":
        return [-1 if s == EMBED else s.block for s in layout.draft_inputs]
    if rule_here == "plus_one":
        if EMBED in layout.draft_inputs:
            raise LayoutError(f"layout {names}: SGLang {version} (DeepSeek, always +1) cannot "
                              "capture the embedding output")
        return [s.block for s in layout.draft_inputs]
    if streams[0] == 1:  # raw id 1 would trigger the +1 rule; say it the +1 way instead
        raise LayoutError(
            f"layout {names}: under SGLang's DeepSeek rule a first slot of block_out:0 is "
            "inexpressible (raw id 1 is read as 'output of layer 1'); start from another slot")
    return streams


def from_ids(ids, target, version: str | None = None,
             verifier: Slot | None = None) -> HiddenStateLayout:
    """What SGLang feeds a draft for config ids `ids` (None: the default [2, N//2, N-3] raw)."""
    n = target.num_layers
    rule_here = rule(target.architecture, version)
    if ids is None:  # the default is used without the +1: raw inputs of layers
        captured = sorted(set(eagle3_default_ids(n)))
    elif rule_here == "raw_if_last_is_n":  # gpt-oss: ids used raw when their max is N
        captured = sorted(set(ids)) if max(ids) == n else sorted({k + 1 for k in ids})
    elif rule_here in ("output_of_layer", "plus_one") or ids[0] == 1:
        captured = sorted({k + 1 for k in ids})
    else:
        captured = sorted(set(ids))
    missing = [i for i in captured if not 0 <= i < n]
    if missing:
        raise LayoutError(f"SGLang ids {list(ids or [])} on a {n}-layer target: capture points "
                          f"{missing} are never reached, so those slots are silently missing")
    slots = tuple(Slot.at_stream_index(i, n) for i in captured)
    return HiddenStateLayout(target, slots, verifier or Slot("block_out", n - 1))


def stamp_export(config: dict, version: str | None) -> dict:
    """`config` (a draft config.json) as exported for SGLang `version`: no top-level id list
    (SGLang never reads it; vLLM would, in its own convention) and `eyas_engine` naming the
    engine and version whose convention its eagle_config ids are in."""
    out = {k: v for k, v in config.items() if k != AUX_IDS_KEY}
    out["eyas_engine"] = {"engine": "sglang", "version": version or VERIFIED}
    return out
