"""The doctor on artifacts on disk: `diagnose_run(data_dir, draft_dir, target_dir, ...)` reads
a run's extraction, a draft of any format and the target, asks `diagnose`, and with an engine
named adds the engine check. `hypothesis`: the layout tested first for a draft whose config
may not say which slots it was trained on."""
from __future__ import annotations

from pathlib import Path

from eyas.store.format import DatasetFormatError
from eyas.store.reader import ExtractedDataset
from eyas.doctor.diagnose import Diagnosis, diagnose
from eyas.conventions.engines import parse_engine
from eyas.conventions.feeds import Feed
from eyas.doctor.engine import claims_feed, engine_check
from eyas.doctor.gap import ReportedAccuracy
from eyas.doctor.load import (find_target, load_features, prepared_chat_template,
                              reported_accuracy, why_not_reported)
from eyas.doctor.static import examine
from eyas.doctor.verdict import Verdict
from eyas.draft.claims import Claims
from eyas.draft.load import load
from eyas.extract.on_demand import open_split
from eyas.layout import HiddenStateLayout, LayoutError


def probe_layout(data_dir) -> HiddenStateLayout:
    """The extraction's layout (the probe split's, else the held-out split's)."""
    try:
        return ExtractedDataset(data_dir, "probe").layout
    except DatasetFormatError:
        return open_split(data_dir, "heldout", states=False).layout


def hypothesis(claims: Claims, feed: Feed | None, data_layout: HiddenStateLayout | None
               ) -> tuple[HiddenStateLayout, str]:
    """The layout the doctor tests first (its "recorded" row), and why: what the config
    claims; where it claims nothing (e.g. a hub draft whose config names no ids), what the
    engine will feed (the draft was trained on that, or the evidence says otherwise), else
    the data's layout."""
    n = claims.num_aux
    if claims.layout is not None:
        return claims.layout, f"what the config says ({claims.says})"
    if feed is not None and feed.layout is not None and len(feed.layout.draft_inputs) == n:
        return feed.layout, f"not in the config; tested: what {feed.label} feeds ({feed.where})"
    if data_layout is not None and len(data_layout.draft_inputs) == n:
        return (HiddenStateLayout(data_layout.target, data_layout.draft_inputs,
                                  data_layout.verifier),
                "not in the config; tested: the data's layout")
    raise LayoutError(f"draft: {claims.says}, and neither the engine's feed nor the data's "
                      f"layout {data_layout.names if data_layout else '(no --data)'} has the "
                      f"{n} slots its fc takes; give --data RUN_DIR/extract of its target")


def diagnose_run(data_dir, draft_dir, target_dir=None, features_path=None, *, steps: int = 3,
                 tolerance: float = 0.05, reported=None,
                 engine: str | None = None, training_data: bool = True) -> Verdict:
    """The doctor on artifacts on disk: RUN_DIR/extract, a draft directory of any format
    eyas.draft.eagle3.formats reads, the target (default: the one RUN_DIR/prepare recorded). What
    training measured while it trained is read from the draft's config unless `reported`
    (per position) is given. `engine` ("vllm", "sglang:0.5.23"): also what that engine will
    feed the draft from its config, and the ids that make it feed the trained slots
    (default for a draft of another format: vllm). `training_data=False`: `data_dir` is not
    the draft's training data (the doctor's own probe), so no accuracy training reported is
    held against it."""
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    target_dir = target_dir or find_target(data_dir)
    if target_dir is None:
        raise FileNotFoundError(f"no target: pass one, or keep {Path(data_dir).parent}/prepare/"
                                "target.json (written by the prepare stage)")
    embedding, head = target_parts(target_dir)
    target = identify(target_dir, causal_lm=False)
    loaded = load(draft_dir, embedding, target, examine=True)
    if engine is None and loaded.claims.format != "eyas":
        engine = "vllm"
    name, version = parse_engine(engine) if engine else (None, None)
    fed = claims_feed(loaded.claims, target, name, version) if name else None
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
    verdict = diagnose(Diagnosis(
        loaded.draft, layout, data_dir, target_head=head, target=target, features=features,
        reported=reported, reported_missing=missing, training_data=training_data,
        prepared_chat_template=prepared_chat_template(data_dir),
        d2t_missing=loaded.d2t_missing, options_recorded=loaded.claims.format == "eyas",
        steps=steps, tolerance=tolerance))
    verdict = verdict.with_runners(examine(draft_dir, target_dir, engine=name or "vllm"))
    if fed is None:
        return verdict
    fitted = verdict.fitted
    return verdict.with_engine(engine_check(
        loaded.claims, fed, why, recorded=verdict.recorded,
        fitted=fitted.layout if fitted is not None else None))
