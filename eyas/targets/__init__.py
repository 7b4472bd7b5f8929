"""The target model: the built-in small Llama, or any local HF causal-LM directory."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from eyas.config import TargetConfig
from eyas.fingerprint import chat_template_fingerprint, tokenizer_fingerprint, weights_fingerprint
from eyas.layout import TargetIdentity


class TargetError(ValueError):
    pass


@dataclass(frozen=True)
class TargetHandle:
    path: Path
    identity: TargetIdentity
    build_report: dict | None  # the built-in target's build report (losses, size, time)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:
        raise TargetError(f"{path}: cannot load a tokenizer ({type(e).__name__}: {e}); a target "
                          "directory needs its tokenizer files (tokenizer.json, "
                          "tokenizer_config.json)") from e


def _read_model_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not path.is_dir():
        raise TargetError(f"target.path={path}: no such directory")
    if not config_file.is_file():
        raise TargetError(f"target.path={path}: no config.json; expected a Hugging Face model "
                          "directory saved with save_pretrained")
    config = json.loads(config_file.read_text())
    archs = config.get("architectures") or []
    if not any(a.endswith("ForCausalLM") for a in archs):
        raise TargetError(f"target.path={path}: architectures {archs} is not a causal LM "
                          "(expected e.g. LlamaForCausalLM); eyas drafts for decoder-only LMs")
    return config


def text_config(config):
    """The language model's part of a model config (a dict or a transformers config):
    multimodal wrappers keep it under `text_config`."""
    if isinstance(config, dict):
        return config.get("text_config") or config
    return getattr(config, "text_config", None) or config


def read_shape(path: str | Path) -> TargetIdentity:
    """Architecture, depth and width from config.json alone (no weights, no fingerprints)."""
    config = _read_model_config(Path(path))
    architecture = next(a for a in config["architectures"] if a.endswith("ForCausalLM"))
    config = text_config(config)
    return TargetIdentity(architecture, int(config["num_hidden_layers"]),
                          int(config["hidden_size"]))


def identify(path: str | Path, tokenizer=None) -> TargetIdentity:
    """The target's identity: architecture, depth, width and content fingerprints."""
    path = Path(path)
    shape = read_shape(path)
    tokenizer = tokenizer or load_tokenizer(path)
    return TargetIdentity(
        architecture=shape.architecture,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        weights=weights_fingerprint(path),
        tokenizer=tokenizer_fingerprint(tokenizer),
        chat_template=chat_template_fingerprint(tokenizer),
    )


def resolve_target(cfg: TargetConfig, progress: bool = True) -> TargetHandle:
    """The configured target's directory and identity, building the built-in one if needed."""
    if cfg.path:
        path = Path(cfg.path).expanduser().resolve()
        return TargetHandle(path, identify(path), None)
    from eyas.targets.builtin import build_builtin_target

    built = build_builtin_target(cfg.builtin, progress=progress)
    return TargetHandle(built.path, identify(built.path), dict(built.report, cached=built.cached))
