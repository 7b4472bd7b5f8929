"""Loading what the doctor examines from disk: a draft (even a broken one, or one another
trainer made: eyas.draft.formats reads each format), features, a run.

A checkpoint without `d2t` is exactly what the doctor must be able to look at, so it is
loaded as vLLM would serve it (draft id i = target id i) and flagged, instead of refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from eyas.draft import formats
from eyas.draft.checkpoint import (
    CONFIG_FILE,
    EXTRA_KEY,
    LAYOUT_KEY,
    load_draft,
    read_config,
)
from eyas.draft.model import Eagle3Config, Eagle3Draft
from eyas.draft.vocab import DraftVocab, VocabError
from eyas.engines import vllm_checkpoint
from eyas.evaluate.fingerprints import HandedFeatures
from eyas.evaluate.gap import ReportedAccuracy, recorded_accuracy
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity


def load_draft_as_served(path, target_embedding, target: TargetIdentity | None = None
                         ) -> tuple[Eagle3Draft, HiddenStateLayout, bool]:
    """(draft, its layout, d2t_missing), as vLLM serves the checkpoint: vLLM reads d2t only
    (t2d is ignored), and without d2t takes draft id i for target id i. So a missing d2t
    becomes the identity and a t2d that disagrees with d2t is rebuilt from d2t. A draft of
    another format (no eyas_layout) is read by eyas.draft.formats against `target`; one whose
    config does not say which slots it was trained on is refused (the doctor finds them)."""
    if target is not None and LAYOUT_KEY not in read_config(path):
        loaded = formats.load(path, target_embedding, target)
        if loaded.claims.layout is None:
            raise LayoutError(
                f"draft {path}: its config ({loaded.claims.format} format) does not say which "
                f"target tensors it was trained on ({loaded.claims.says}); run python -m "
                f"workflows.doctor --draft {path} --data RUN_DIR/extract --engine vllm "
                "--write-fixed DIR to establish them, then use DIR")
        return loaded.draft, loaded.claims.layout, loaded.d2t_missing
    weights = Path(path) / vllm_checkpoint.DRAFT_WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: no draft weights (a draft directory holds "
                                f"config.json and {vllm_checkpoint.DRAFT_WEIGHTS_FILE}, as eyas/train and "
                                "vLLM write it)")
    tensors = load_file(str(weights))
    missing = "d2t" not in tensors
    if not missing and "t2d" in tensors:
        try:
            draft, layout, _ = load_draft(path, target_embedding)
            return draft, layout, False
        except VocabError:  # t2d disagrees with d2t: serve by d2t, as vLLM does
            pass
    config = read_config(path)
    if LAYOUT_KEY not in config:
        raise LayoutError(f"{Path(path) / CONFIG_FILE}: no {LAYOUT_KEY} (the slots the draft "
                          "was trained on); save the draft with eyas.draft.checkpoint.save_draft "
                          "and the layout of its training data")
    hyper, _ = vllm_checkpoint.read_draft_config(config, f"draft {path}")
    layout = HiddenStateLayout.from_dict(config[LAYOUT_KEY], source=f"draft {path}")
    size, target_size = hyper["draft_vocab_size"], hyper["vocab_size"]
    d2t = tensors.get("d2t", torch.zeros(size, dtype=torch.int64))
    target_ids = torch.arange(size) + d2t
    if int(target_ids.min()) < 0 or int(target_ids.max()) >= target_size:
        raise VocabError(f"draft {path}: d2t maps draft ids outside the target vocab "
                         f"0..{target_size - 1}; d2t must hold offsets (target id = draft id "
                         "+ d2t[draft id])")
    t2d = torch.zeros(target_size, dtype=torch.bool)
    t2d[target_ids] = True
    tensors.update(d2t=d2t, t2d=t2d)
    draft = Eagle3Draft(Eagle3Config(**hyper), target_embedding, DraftVocab(d2t, t2d))
    draft = draft.to(tensors["fc.weight"].dtype)
    draft.load_state_dict(tensors, strict=False)  # embed_tokens: the target's, not saved
    return draft, layout, missing


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
    record = Path(data_dir).parent / "prepare" / "target.json"
    return json.loads(record.read_text())["target_path"] if record.exists() else None


def prepared_chat_template(data_dir) -> str:
    manifest = Path(data_dir).parent / "prepare" / "manifest.json"
    if not manifest.exists():
        return ""
    return json.loads(manifest.read_text()).get("chat_template_fingerprint", "")


def probe_layout(data_dir) -> HiddenStateLayout:
    """The extraction's layout (the probe split's, else the held-out split's)."""
    from eyas.dataset.format import DatasetFormatError
    from eyas.dataset.reader import ExtractedDataset
    try:
        return ExtractedDataset(data_dir, "probe").layout
    except DatasetFormatError:
        from eyas.extract.on_demand import open_split
        return open_split(data_dir, "heldout", states=False).layout


def hypothesis(claims, feed, data_layout: HiddenStateLayout | None
               ) -> tuple[HiddenStateLayout, str]:
    """The layout the doctor tests first (its "recorded" row), and why: what the config
    claims; where it claims nothing, what the engine will feed (the hub draft's case: it
    was trained on that, or the evidence says otherwise), else the data's layout."""
    n = claims.num_aux
    if claims.layout is not None:
        return claims.layout, f"what the config says ({claims.says})"
    if feed is not None and feed.layout is not None and len(feed.layout.draft_inputs) == n:
        return feed.layout, f"not in the config; tested: what {feed.engine} feeds ({feed.where})"
    if data_layout is not None and len(data_layout.draft_inputs) == n:
        return (HiddenStateLayout(data_layout.target, data_layout.draft_inputs,
                                  data_layout.verifier),
                "not in the config; tested: the data's layout")
    raise LayoutError(f"draft: {claims.says}, and neither the engine's feed nor the data's "
                      f"layout {data_layout.names if data_layout else '(no --data)'} has the "
                      f"{n} slots its fc takes; give --data RUN_DIR/extract of its target")


def diagnose_run(data_dir, draft_dir, target_dir=None, features_path=None, *, steps: int = 3,
                 tolerance: float = 0.05, reported=None,
                 engine: str | None = None, training_data: bool = True):
    """The doctor on artifacts on disk: RUN_DIR/extract, a draft directory of any format
    eyas.draft.formats reads, the target (default: the one RUN_DIR/prepare recorded). What
    training measured while it trained is read from the draft's config unless `reported`
    (per position) is given. `engine` ("vllm", "sglang:0.5.23"): also what that engine will
    feed the draft from its config, and the ids that make it feed the trained slots
    (default for a draft of another format: vllm). `training_data=False`: `data_dir` is not
    the draft's training data (the doctor's own probe), so no accuracy training reported is
    held against it."""
    from eyas.draft.formats.feed import feed as engine_feed
    from eyas.draft.formats.feed import parse_engine
    from eyas.evaluate.doctor import diagnose, engine_check
    from eyas.target import identify
    from eyas.target.parts import target_parts

    target_dir = target_dir or find_target(data_dir)
    if target_dir is None:
        raise FileNotFoundError(f"no target: pass one, or keep {Path(data_dir).parent}/prepare/"
                                "target.json (written by the prepare stage)")
    embedding, head = target_parts(target_dir)
    target = identify(target_dir)
    loaded = formats.load(draft_dir, embedding, target)
    if engine is None and loaded.claims.format != "eyas":
        engine = "vllm"
    name, version = parse_engine(engine) if engine else (None, None)
    fed = engine_feed(loaded.claims, target, name, version) if name else None
    layout, why = hypothesis(loaded.claims, fed, probe_layout(data_dir))
    features = (load_features(features_path, len(layout.draft_inputs))
                if features_path else None)
    if reported is not None and not isinstance(reported, ReportedAccuracy):
        reported = ReportedAccuracy.given(reported)
    if not training_data:
        reported, missing = None, ("the probe is the target's answers to the doctor's prompts, "
                                   "not the draft's training data: no training accuracy to "
                                   "hold it to")
    else:
        reported = reported if reported is not None else reported_accuracy(draft_dir)
        missing = why_not_reported(draft_dir)
    verdict = diagnose(loaded.draft, layout, data_dir, head, steps=steps, features=features,
                       reported=reported, reported_missing=missing,
                       training_data=training_data,
                       tolerance=tolerance, target=target,
                       prepared_chat_template=prepared_chat_template(data_dir),
                       d2t_missing=loaded.d2t_missing)
    if fed is not None:
        engine_check(verdict, loaded.claims, fed, why, name, version)
    return verdict
