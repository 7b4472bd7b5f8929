"""A draft directory in eyas's own format, whatever the family: `config.json` (read by the
engine, plus eyas's keys) beside the weights.

    eyas_layout      the HiddenStateLayout the draft was trained on (the slots, by name)
    eyas_model_args  the model's constructor arguments (nanoGPT's model_args habit): the
                     family's model is rebuilt from them, never re-derived from a config
    eyas_extra       what training recorded (accuracy while training, its settings)
    eyas_format      the version of this format (DRAFT_FORMAT): a config with eyas_layout of
                     another version, or of none, is refused (`check_format`)
    eyas_family      the registered family that wrote it (eyas.draft.families; the key is
                     eyas.conventions.kinds.FAMILY_KEY, which every config reader knows)
"""
from __future__ import annotations

import os
from pathlib import Path

from eyas.files import FORMAT_KEY, atomic_path, atomic_write, check_format, read_model_config

CONFIG_FILE = "config.json"
LAYOUT_KEY = "eyas_layout"
MODEL_ARGS_KEY = "eyas_model_args"
EXTRA_KEY = "eyas_extra"
DRAFT_FORMAT = 1


def stamp(config: dict) -> dict:
    """`config` marked as this version of eyas's format (every writer of eyas_layout calls it)."""
    config[FORMAT_KEY] = DRAFT_FORMAT
    return config


def check_draft_format(config: dict, source) -> None:
    """Refuse an eyas-format config (one with eyas_layout) of another format version."""
    if LAYOUT_KEY in config:
        check_format(config, DRAFT_FORMAT, source, "Retrain it with this eyas, or read it "
                     "with the eyas that wrote it")


def read_config(path: str | os.PathLike) -> dict:
    return read_model_config(path, "draft")


def write_draft(out_dir: str | os.PathLike, weights_file: str, tensors: dict,
                config_text: str) -> Path:
    """The weights, then config.json, each written to a temp name and renamed (a killed
    writer leaves no half file; the config, last, marks the draft whole)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / weights_file) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    atomic_write(out / CONFIG_FILE, config_text + "\n")
    return out
