"""Loading what the doctor examines from disk besides the draft (eyas.draft.load.load reads
any draft as vLLM serves it, even a broken one: a missing d2t is flagged, not refused):
features, what training reported, what the run's prepare stage recorded.
"""
from __future__ import annotations

import json

from safetensors.torch import load_file

from eyas.draft.directory import EXTRA_KEY, read_config
from eyas.doctor.fingerprints import HandedFeatures
from eyas.doctor.gap import ReportedAccuracy, recorded_accuracy
from eyas.run_records import MANIFEST_FILE, RunDir, read_target


def _features_format(n_slots: int) -> str:
    return (f"a safetensors file with `hidden_states` [T, {n_slots}, H] (vLLM's "
            f"extract_hidden_states output), `draft_inputs` [T, {n_slots}*H], or "
            f"`slot:0`..`slot:{n_slots - 1}` [T, H] each; plus `token_ids` [T] when known")


def load_features(path, n_slots: int) -> HandedFeatures:
    """Features an engine fed the draft, from a safetensors file with either
    `hidden_states` [T, n, H] (vLLM's extract_hidden_states output), `draft_inputs`
    [T, n*H], or `slot:0`..`slot:{n-1}` [T, H] each; plus `token_ids` [T] when known."""
    try:
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error type for a file it can't parse
        raise ValueError(f"{path}: not a safetensors file ({type(e).__name__}: {e}); features "
                         f"are expected as {_features_format(n_slots)}") from e
    ids = tensors.get("token_ids")
    if "hidden_states" in tensors:
        return HandedFeatures.from_concat(tensors["hidden_states"], n_slots, ids)
    if "draft_inputs" in tensors:
        return HandedFeatures.from_concat(tensors["draft_inputs"], n_slots, ids)
    slots = {int(k.split(":")[1]): v for k, v in tensors.items() if k.startswith("slot:")}
    if len(slots) != n_slots:
        raise ValueError(f"{path}: expected {_features_format(n_slots)}; found "
                         f"{sorted(tensors)}")
    return HandedFeatures.from_concat(slots, n_slots, ids)


def reported_accuracy(draft_dir) -> ReportedAccuracy | None:
    """What training measured while it trained (eyas/train writes it into the draft config's
    eyas_extra); None for a draft without that record."""
    return recorded_accuracy(read_config(draft_dir).get(EXTRA_KEY) or {})[0]


def why_not_reported(draft_dir) -> str:
    """Why a draft has no reported accuracy, for the doctor's note."""
    return recorded_accuracy(read_config(draft_dir).get(EXTRA_KEY) or {})[1]


def find_target(data_dir) -> str | None:
    """The run's target directory, as the prepare stage recorded it (RUN_DIR/prepare)."""
    record = read_target(RunDir.of_stage(data_dir).root)
    return record.target_path if record else None


def prepared_chat_template(data_dir) -> str:
    manifest = RunDir.of_stage(data_dir).prepare / MANIFEST_FILE
    if not manifest.exists():
        return ""
    return json.loads(manifest.read_text()).get("chat_template_fingerprint", "")
