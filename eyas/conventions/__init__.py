"""One module per engine: the only place that knows that engine's hidden-state id convention
(and, later, its checkpoint key names). Every id list in eyas is compiled here from a
`HiddenStateLayout`, and parsed back here into the slots the engine really captures.

Architecture families share a capture rule within an engine; `family()` names them: for vLLM
every target architecture whose model implements its EAGLE-3 interface (vllm_targets.py, read
from its source), for SGLang those whose model code eyas has read. Which config key each
engine and runner reads the ids from is eyas/conventions/rules.py's; what else a caller may ask
of an engine by name (boots vLLM? checks parity?) is eyas/conventions/engines.py's.
"""
from __future__ import annotations

from eyas.conventions.vllm_targets import EAGLE3_TARGETS
from eyas.layout import LayoutError

# SGLang 0.5.23: the targets whose models/*.py eyas has read (set_eagle3_layers_to_capture;
# tests/data/published_drafts/RULES.md cites each file and line)
_SGLANG_FAMILIES = {
    "llama": ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
              "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen2_5_VLForConditionalGeneration",
              "Llama4ForConditionalGeneration", "Phi3ForCausalLM", "MiniMaxM2ForCausalLM",
              "LongcatFlashForCausalLM", "Gemma3ForCausalLM", "BailingMoeV2ForCausalLM"),
    "deepseek": ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK2ForCausalLM",
                 "KimiK25ForConditionalGeneration"),
    "gptoss": ("GptOssForCausalLM",),
}


class UnverifiedVersion(LayoutError):
    """An engine version whose capture convention eyas has not read: its ids might mean other
    tensors, so nothing is compiled for it."""


class NoEagle3(LayoutError):
    """A target the engine cannot serve an EAGLE-3 draft for (or whose capture eyas has not
    read for that engine): said, never guessed."""


def family(architecture: str, engine: str = "vllm") -> str:
    """The capture rule `engine` applies to targets of `architecture`: "llama" or "deepseek"
    (and for SGLang "gptoss")."""
    return _FAMILY[engine](architecture)


def _vllm_family(architecture: str) -> str:
    if EAGLE3_TARGETS.get(architecture) == "unread":
        raise NoEagle3(
            f"architecture {architecture!r}: vLLM 0.32 serves EAGLE-3 drafts for it with its "
            "own capture code (a platform package under vllm/models/), which eyas has not "
            "read; refusing to guess which layers it feeds")
    if architecture in EAGLE3_TARGETS:
        return EAGLE3_TARGETS[architecture]
    raise NoEagle3(
        f"architecture {architecture!r}: vLLM 0.32 has no EAGLE-3 interface for it (its "
        "model class does not implement SupportsEagle3; eyas/conventions/vllm_targets.py "
        "lists the ones that do), so it cannot feed an EAGLE-3 draft on this target")


def _sglang_family(architecture: str) -> str:
    for name, archs in _SGLANG_FAMILIES.items():
        if architecture in archs:
            return name
    known = ", ".join(a for archs in _SGLANG_FAMILIES.values() for a in archs)
    raise NoEagle3(f"architecture {architecture!r}: SGLang's capture code for it has not been "
                   f"read by eyas (read: {known}); refusing to guess")


_FAMILY = {"vllm": _vllm_family, "sglang": _sglang_family}


def check_version(engine: str, version: str | None, known: dict[str, str]) -> str:
    """Map an engine version to the convention verified for it; unknown versions are refused.

    `known` maps a "major.minor" prefix to a convention name. None means the newest known.
    """
    if version is None:
        return known[max(known, key=lambda v: tuple(int(x) for x in v.split(".")))]
    prefix = ".".join(str(version).split(".")[:2])
    if prefix not in known:
        raise UnverifiedVersion(
            f"{engine} {version}: its hidden-state capture convention has not been verified "
            f"(verified: {', '.join(sorted(known))}). Read its model code, then add it to "
            f"eyas/conventions/{engine.lower()}.py; refusing to guess")
    return known[prefix]
