"""The target model: the built-in small Llama, or any local HF causal-LM directory."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eyas.config import TargetConfig
from eyas.files import read_config_object
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


def read_config_file(config_file: Path) -> dict:
    """A target's config.json as a dict; one that is not JSON, or not a JSON object, is
    refused naming the file."""
    return read_config_object(config_file, "a model config (with architectures, "
                              "num_hidden_layers, ...)", TargetError)


def _read_model_config(path: Path, causal_lm: bool = True) -> dict:
    config_file = path / "config.json"
    if not path.is_dir():
        raise TargetError(f"target.path={path}: no such directory")
    if not config_file.is_file():
        raise TargetError(f"target.path={path}: no config.json; expected a Hugging Face model "
                          "directory saved with save_pretrained")
    config = read_config_file(config_file)
    archs = config.get("architectures") or []
    if causal_lm and not any(a.endswith("ForCausalLM") for a in archs):
        raise TargetError(f"target.path={path}: architectures {archs} is not a causal LM "
                          "(expected e.g. LlamaForCausalLM); eyas drafts for decoder-only LMs")
    return config


# where real configs keep the language model's part, depth and width (LongCat-Flash: num_layers)
TEXT_KEYS = ("text_config", "language_config", "llm_config")
DEPTH_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim")


def text_config(config):
    """The language model's part of a model config (a dict or a transformers config):
    multimodal wrappers keep it under `text_config` (or `language_config`, `llm_config`)."""
    get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    return next((get(k) for k in TEXT_KEYS if get(k)), None) or config


def _first(config: dict, keys, what: str, source: str) -> int:
    for key in keys:
        if isinstance(config.get(key), int):
            return int(config[key])
    raise TargetError(f"{source}: no {what} under any key eyas knows ({', '.join(keys)}); "
                      f"found keys {sorted(config)[:30]}")


def shape_from_config(config: dict, source: str = "config.json") -> TargetIdentity:
    """Architecture (the first listed, a wrapper's own), depth and width from a target's
    config.json (a dict), the language model's part of a multimodal wrapper read for the
    last two."""
    archs = config.get("architectures") or []
    if not archs:
        raise TargetError(f"{source}: no `architectures` list; it names the model class an "
                          "engine builds (e.g. [\"LlamaForCausalLM\"])")
    text = text_config(config)
    where = source + ("" if text is config else
                      f" ({next(k for k in TEXT_KEYS if config.get(k) is text)})")
    return TargetIdentity(str(archs[0]), _first(text, DEPTH_KEYS, "decoder depth", where),
                          _first(text, WIDTH_KEYS, "hidden size", where))


def read_shape(path: str | Path, causal_lm: bool = True) -> TargetIdentity:
    """Architecture, depth and width from config.json alone (no weights, no fingerprints).
    `causal_lm`: refuse a model eyas cannot run as a target (the doctor's static reading
    takes any architecture, multimodal wrappers included)."""
    path = Path(path)
    config = _read_model_config(path, causal_lm)
    if causal_lm:  # the class eyas will load and run
        config = {**config, "architectures": [
            next(a for a in config["architectures"] if a.endswith("ForCausalLM"))]}
    return shape_from_config(config, str(path / "config.json"))


def identify(path: str | Path, tokenizer=None, causal_lm: bool = True) -> TargetIdentity:
    """The target's identity: architecture, depth, width and content fingerprints.
    `causal_lm=False`: any architecture (the doctor examines multimodal wrappers too)."""
    path = Path(path)
    shape = read_shape(path, causal_lm)
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
    """The configured target's directory and identity, building the built-in one (or
    converting the packaged one) if needed."""
    if cfg.path:
        path = Path(cfg.path).expanduser().resolve()
        return TargetHandle(path, identify(path), None)
    if cfg.packaged:
        from eyas.targets.packaged import build_packaged_target

        path, report, cached = build_packaged_target(cfg.packaged, cfg.builtin.cache_dir)
        return TargetHandle(path, identify(path), dict(report, cached=cached))
    from eyas.targets.builtin import build_builtin_target

    built = build_builtin_target(cfg.builtin, progress=progress)
    return TargetHandle(built.path, identify(built.path), dict(built.report, cached=built.cached))
