"""A draft directory in eyas's own format, whatever the family: `config.json` (read by the
engine, plus eyas's keys) beside the weights.

    eyas_layout      the HiddenStateLayout the draft was trained on (the slots, by name)
    eyas_model_args  the model's constructor arguments (nanoGPT's model_args habit): the
                     family's model is rebuilt from them, never re-derived from a config
    eyas_extra       what training recorded (accuracy while training, its settings)
"""
from __future__ import annotations

import os

from eyas.files import read_model_config

CONFIG_FILE = "config.json"
LAYOUT_KEY = "eyas_layout"
MODEL_ARGS_KEY = "eyas_model_args"
EXTRA_KEY = "eyas_extra"


def read_config(path: str | os.PathLike) -> dict:
    return read_model_config(path, "draft")
