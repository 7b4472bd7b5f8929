"""Per engine and version: which target tensors the engine will feed a draft from its config,
where serving it would crash, and the ids to write so it feeds the slots the draft was
trained on.

vLLM 0.32's V1 runner, the one its CPU build runs (eyas.conventions.vllm_checkpoint
.read_draft_config reads the config as it does; the V2 runner, a GPU's default, reads other
keys: eyas/conventions/rules.py, eyas/doctor/static.py): capture the top-level list, else
eagle_config's, else the default (2, N//2, N-3), as inputs of layers;
fc sized from num_aux_hidden_states, else len(eagle_config's list), else 3; a `d2t` in a
full-vocabulary draft is refused at load (no such parameter).
SGLang (eyas.conventions.sglang, per version): ONLY eagle_config's list, else the default used
raw; its Llama-family rule reads id k as the output of layer k; fc takes 3 states.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from eyas.draft.eagle3.formats.common import Claims, FormatError
from eyas.conventions import check_version, family, sglang, vllm
from eyas.conventions.engines import engine_rules
from eyas.conventions.vllm import AUX_IDS_KEY
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity

ENGINES = ("vllm", "sglang")


@dataclass
class EngineFeed:
    engine: str  # "vLLM 0.32", "SGLang 0.5.23"
    ids: list[int] | None  # the list it reads (None: none, so its default)
    where: str  # where it read them, in words
    layout: HiddenStateLayout | None  # what it feeds; None where nothing can be fed
    problems: list[str] = field(default_factory=list)  # crashes or misreads whatever the slots


def parse_engine(text: str) -> tuple[str, str | None]:
    """'vllm' -> ('vllm', None); 'sglang:0.5.23' -> ('sglang', '0.5.23')."""
    name, _, version = str(text).strip().partition(":")
    if name.lower() not in ENGINES:
        raise ValueError(f"engine {text!r}: use vllm[:VERSION] or sglang[:VERSION], e.g. "
                         f"vllm:0.32 or sglang:{sglang.VERIFIED}")
    return name.lower(), version or None


def feed(claims: Claims, target: TargetIdentity, engine: str, version: str | None = None
         ) -> EngineFeed:
    """What `engine` `version` feeds this draft from its config (UnverifiedVersion for a
    version whose rules eyas has not read)."""
    return _FEEDS[engine](claims, target, version)


def _vllm(claims: Claims, target: TargetIdentity, version) -> EngineFeed:
    check_version("vLLM", version, vllm.KNOWN_VERSIONS)
    v, n = claims.view, target.num_layers
    ids = v.ids
    where = ("top-level" if v.top_ids else "eagle_config" if ids else
             f"none in the config, so its default {list(vllm.default_ids(n))}")
    # the CPU build's runner; both runners: eyas.doctor.static
    out = EngineFeed(f"vLLM {version or max(vllm.KNOWN_VERSIONS)} V1 runner", ids, where, None)
    try:
        out.layout = vllm.from_ids(ids, target)
    except LayoutError as e:
        out.problems.append(str(e))
    fc = v.hyper["num_aux_hidden_states"]
    if fc != claims.num_aux:
        how = ("num_aux_hidden_states" if v.num_aux_key is not None else
               "the length of eagle_config's list" if v.nested_ids else "its default of 3")
        out.problems.append(
            f"vLLM sizes fc from {how} for {fc} states, but the weights' fc takes "
            f"{claims.num_aux}: loading crashes on fc.weight's shape")
    elif out.layout is not None and len(out.layout.draft_inputs) != fc:
        out.problems.append(
            f"vLLM captures {len(out.layout.draft_inputs)} distinct states (ids "
            f"{sorted(set(ids or vllm.default_ids(n)))}) but fc takes {fc}: the first "
            "speculative step crashes on the width")
    if not v.use_aux:
        out.problems.append("eagle_config.use_aux_hidden_state is false: vLLM feeds no aux "
                            "states and builds no fc")
    args = claims.model_args
    if claims.has_d2t and args["draft_vocab_size"] == args["vocab_size"]:
        out.problems.append("a d2t tensor in a full-vocabulary draft: vLLM has no parameter "
                            "for it and refuses to load the weights; drop d2t/t2d")
    if ids and family(target.architecture) == "deepseek" and 0 in ids:
        out.problems.append("id 0 (embedding) crashes vLLM's DeepSeek-family capture")
    return out


def _sglang(claims: Claims, target: TargetIdentity, version) -> EngineFeed:
    if claims.model_args.get("mla"):
        raise FormatError("an MLA (Eagle3DeepseekV2/V3) draft: eyas has read how vLLM serves "
                          "it (deepseek_eagle3.py), not SGLang; examine it with --engine vllm")
    sglang.rule(target.architecture, version)
    v = claims.view
    ids = v.nested_ids
    where = ("eagle_config" if ids else "none under eagle_config (SGLang ignores top-level "
             "ids), so its default used raw")
    out = EngineFeed(f"SGLang {version or sglang.VERIFIED}", ids, where, None)
    if v.top_ids and not ids:
        out.problems.append(f"the ids {v.top_ids} are only at the top level, which SGLang "
                            "never reads")
    try:
        out.layout = sglang.from_ids(ids, target, version)
    except LayoutError as e:
        out.problems.append(str(e))
    ignored = sglang.ignored_options(claims.model_args, version)
    if ignored:
        out.problems.append(f"SGLang {version or sglang.VERIFIED} ignores {', '.join(ignored)} "
                            "(and drops any weights it has): it would serve another function than "
                            "the draft's")
    if claims.num_aux != sglang.FC_SLOTS:
        out.problems.append(f"SGLang builds fc for {sglang.FC_SLOTS} states, the weights' "
                            f"fc takes {claims.num_aux}: loading crashes")
    elif out.layout is not None and len(out.layout.draft_inputs) != sglang.FC_SLOTS:
        out.problems.append(f"SGLang captures {len(out.layout.draft_inputs)} states but fc "
                            f"takes {sglang.FC_SLOTS}: the first step crashes")
    return out


_FEEDS = {"vllm": _vllm, "sglang": _sglang}


def ids_to_write(layout: HiddenStateLayout, engine: str, version: str | None = None
                 ) -> tuple[dict, str]:
    """(config keys to set, the same in words) so `engine` feeds `layout`; LayoutError where
    no id list can."""
    rules = engine_rules(engine)
    ids = rules.ids.to_ids(layout, version)
    nested = {"eagle_config": {AUX_IDS_KEY: ids, "use_aux_hidden_state": True}}
    if rules.reads_top_level_ids:
        return ({AUX_IDS_KEY: ids, "num_aux_hidden_states": len(ids), **nested},
                (f"{AUX_IDS_KEY} {ids} at the top level and under eagle_config, and "
                 f"num_aux_hidden_states {len(ids)}"))
    return nested, f"eagle_config.{AUX_IDS_KEY} {ids} (SGLang reads only that one)"
