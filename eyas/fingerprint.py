"""Content fingerprints of a target: weights, tokenizer and chat template.

A fingerprint is a short hex digest that changes whenever the thing it names changes, so a
draft can't be trained, evaluated or served against another target revision silently.
Weights of a large target can be hundreds of GB: their fingerprint hashes each weight file's
size and header plus fixed byte samples spread over the file, which costs milliseconds, and
changes with any change of tensor names, shapes, dtypes or sampled content.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

_SAMPLES_PER_FILE = 16
_SAMPLE_BYTES = 1 << 16
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def digest(data: bytes | str, length: int = 16) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()[:length]


def json_digest(obj, length: int = 16) -> str:
    return digest(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str), length)


def file_sample_digest(path: str | os.PathLike, h=None) -> str:
    """sha256 over size, the first 1 MiB (a safetensors header) and evenly spaced samples."""
    h = h or hashlib.sha256()
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > (1 << 20):
            for i in range(_SAMPLES_PER_FILE):
                f.seek((size - _SAMPLE_BYTES) * i // max(1, _SAMPLES_PER_FILE - 1))
                h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


def weights_fingerprint(model_dir: str | os.PathLike) -> str:
    files = sorted(p for p in Path(model_dir).iterdir() if p.name.endswith(_WEIGHT_SUFFIXES))
    if not files:
        raise FileNotFoundError(
            f"{model_dir}: no weight files ({', '.join(_WEIGHT_SUFFIXES)}); "
            "is this a Hugging Face model directory saved with save_pretrained?")
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        file_sample_digest(p, h)
    return h.hexdigest()[:16]


def tokenizer_fingerprint(tokenizer) -> str:
    """Digest of the vocabulary and special tokens (not of file formatting)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = sorted(str(t) for t in tokenizer.all_special_tokens)
    return json_digest({"vocab": vocab, "special": special})


def chat_template_fingerprint(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
            "eyas renders conversations with the target's template: add one "
            "(tokenizer.chat_template) to the target directory")
    if isinstance(template, dict):  # several named templates
        template = json.dumps(template, sort_keys=True)
    return digest(template)
