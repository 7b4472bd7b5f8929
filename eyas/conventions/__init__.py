"""One module per engine: the only place that knows that engine's hidden-state id convention
(and, later, its checkpoint key names). Every id list in eyas is compiled here from a
`HiddenStateLayout`, and parsed back here into the slots the engine really captures.

Architecture families share a capture rule within an engine; `family()` names them.
"""
from __future__ import annotations

from eyas.layout import LayoutError

_FAMILIES = {
    "llama": ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
              "Qwen3MoeForCausalLM"),
    "deepseek": ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK2ForCausalLM"),
}


class UnverifiedVersion(LayoutError):
    """An engine version whose capture convention eyas has not read: its ids might mean other
    tensors, so nothing is compiled for it."""


def family(architecture: str) -> str:
    for name, archs in _FAMILIES.items():
        if architecture in archs:
            return name
    known = ", ".join(a for archs in _FAMILIES.values() for a in archs)
    raise LayoutError(f"architecture {architecture!r}: its engines' capture convention is not "
                      f"known to eyas (known: {known}); refusing to guess")


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
