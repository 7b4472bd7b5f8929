"""The skew doctor: which tensors was this draft trained on, and which is it (to be) fed?

Evidence, strongest first:
- the draft evaluated on the probe split (every layer stored) under candidate layouts
  (eyas/doctor/candidates.py): a draft fits the slots it was trained on, so the layout with
  the highest accuracy is the one its weights were trained on. Ranked by full accuracy
  averaged over the draft positions (every position depends on what fc was fed at the
  first); whether a candidate fits better (a fault), worse (OK) or within the noise
  (INCONCLUSIVE, never OK on a coin toss) is decided by paired evidence on the same tokens
  (eyas/doctor/evidence.py), so probe noise neither raises an alarm nor passes for proof.
- features handed in (e.g. captured from a serving engine), matched to stored slots
  (eyas/doctor/fingerprints.py): which layers the engine really reads.
- the training gap (eyas/doctor/gap.py): what training measured while it trained not
  reproduced by the standalone run on the training shards.
- static checks: target fingerprints of draft, data and target at hand; d2t missing or the
  identity; chat template changed since prepare; verifier slot after the final norm.
Every fault is a `Finding` with a name a program can test and a message that names the fix.

What the doctor is asked is one `Diagnosis`: what is examined (a draft, the layout it is taken
to be trained on, an extraction, the target's head and identity), the evidence at hand (fed
features, what training reported, what prepare recorded, whether d2t is missing), the settings.
"""
from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace
from pathlib import Path

import torch
from torch import nn

from eyas.store.format import DatasetFormatError
from eyas.store.reader import ExtractedDataset
from eyas.doctor.candidates import candidate_layouts, engine_ids, relation, slots_in_words
from eyas.doctor.checks import fed_slots_finding, postnorm_message, static_findings
from eyas.doctor.evidence import weigh
from eyas.doctor.findings import Finding
from eyas.doctor.options import options_finding, weigh_options
from eyas.doctor.fingerprints import HandedFeatures, match_features, split_norms
from eyas.doctor.gap import NOT_CHECKED, ReportedAccuracy, accuracy_gap
from eyas.doctor.verdict import LayoutRow, Verdict
from eyas.draft.accuracy import StepAccuracy, evaluate_draft
from eyas.extract.on_demand import open_split
from eyas.layout import HiddenStateLayout, TargetIdentity


@dataclass(frozen=True)
class Diagnosis:
    """What the doctor is asked: `diagnose(Diagnosis(draft, layout, data_dir, ...))`."""

    # what is examined
    draft: nn.Module  # any family's model (eyas.draft.families)
    layout: HiddenStateLayout  # the slots it is taken to be trained on (its checkpoint's)
    data_dir: str | Path  # an extraction (RUN_DIR/extract): its probe split, else held-out
    _: KW_ONLY
    target_head: torch.nn.Module | None = None  # final norm + lm_head: the accuracy evidence
    target: TargetIdentity | None = None  # the target at hand, when known
    # the evidence at hand
    features: HandedFeatures | None = None  # what an engine fed the draft, to match to slots
    reported: ReportedAccuracy | None = None  # what training measured while it trained
    reported_missing: str = ""  # why there is no `reported`, for the note
    training_data: bool = True  # False: `data_dir` is not what the draft trained on
    train_accuracy: StepAccuracy | None = None  # standalone on the training shards, if known
    prepared_chat_template: str = ""  # the template's fingerprint prepare recorded
    d2t_missing: bool = False  # the checkpoint has no d2t (loaded as the identity)
    options_recorded: bool = True  # False: only the config says which norm options it had
    # the settings
    steps: int = 3  # draft positions evaluated
    tolerance: float = 0.05  # allowed shortfall against `reported`
    max_train_samples: int | None = None  # of the training shards, for the gap
    batch_size: int = 8


def _fit_finding(fitted: LayoutRow, recorded: LayoutRow, z: float) -> Finding:
    if fitted.kind == "postnorm_verifier":
        return Finding(fitted.kind, postnorm_message(fitted.layout))
    got, want = fitted.layout, recorded.layout
    return Finding(fitted.kind, (
        f"the draft's weights fit {slots_in_words(got.draft_inputs)} (mean accuracy "
        f"{fitted.score:.3f}), not the {slots_in_words(want.draft_inputs)} its checkpoint "
        f"records ({recorded.score:.3f}), beyond doubt (paired z {z:+.1f}): it was trained on "
        "other slots than its data says (e.g. HF hidden_states[k] read as the output of block "
        "k). Re-extract with the layout named by slots and retrain, or serve it as what it "
        f"is: {engine_ids(got)}"))



def diagnose(request: Diagnosis) -> Verdict:
    """Everything the doctor can tell about `request.draft` (with `request.layout`) and the
    extraction at `request.data_dir`. `target_head` enables the accuracy evidence; `reported`
    the gap alarm; without it a note says the gap was not checked, and why
    (`reported_missing`). `training_data=False`: `data_dir` is not what the draft trained on
    (the doctor's own probe), so no gap is checked."""
    r = request
    try:
        probe, has_probe = ExtractedDataset(r.data_dir, "probe"), True
    except DatasetFormatError:  # extracted with probe_samples=0: fewer layouts can be tried
        probe, has_probe = open_split(r.data_dir, "heldout"), False
    data_layout = probe.layout
    stored = set(probe[0].slots)
    verdict = Verdict(r.layout, data_layout, static_findings(
        r.layout, data_layout, r.draft.vocab, r.target, r.prepared_chat_template,
        r.d2t_missing))
    if not has_probe:
        verdict.notes.append("no probe set (every layer) in the data: only layouts built from "
                             f"the stored slots {sorted(stored)} were tried; extract with "
                             "extract.probe_samples > 0 for the full evidence")
    same_shape = (r.layout.target.num_layers, r.layout.target.hidden_size) == (
        data_layout.target.num_layers, data_layout.target.hidden_size)
    if not same_shape:
        verdict.notes.append("draft and data targets differ in shape: no accuracy evidence")
        return verdict
    kind = relation(r.layout, data_layout)
    if kind != "same":
        verdict.findings.append(Finding(kind, (
            f"the draft's checkpoint records {r.layout.names} (verifier "
            f"{r.layout.verifier.name}) but the data records {data_layout.names} (verifier "
            f"{data_layout.verifier.name}): evaluate and serve a draft with the layout it was "
            "trained on")))
    verdict.probe_norms = split_norms(probe)
    if r.features is not None:
        verdict.feature_matches = match_features(r.features, r.layout, probe,
                                                 verdict.probe_norms)
        finding = fed_slots_finding(r.layout, verdict.engine_layout,
                                    [m.best for m in verdict.feature_matches])
        if finding is not None:
            verdict.findings.append(finding)
    if r.target_head is None:
        verdict.notes.append("no target head given: the accuracy evidence was not gathered")
        return verdict
    for c in candidate_layouts(r.layout):
        if not {s.name for s in c.layout.slots} <= stored:
            continue
        acc = evaluate_draft(r.draft, probe, r.target_head, r.steps, c.layout, r.batch_size)
        verdict.table.append(LayoutRow(c.kind, c.note, c.layout, acc))
    recorded = next((row for row in verdict.table if row.kind == "recorded"), None)
    if recorded is not None:  # is the evidence conclusive? (eyas/doctor/evidence.py)
        others = [row for row in verdict.table if row is not recorded]
        verdict.weighing = weigh(r.draft, probe, r.target_head, recorded.layout,
                                 [(row.layout, row.kind) for row in others], r.batch_size)
        if verdict.fitted is not None:  # a candidate fits better beyond doubt
            verdict.findings.append(_fit_finding(verdict.fitted, recorded,
                                                 verdict.weighing.better.z))
        if not r.options_recorded and r.steps >= 2:  # eyas/doctor/options.py
            verdict.options = weigh_options(r.draft, probe, r.target_head, recorded.layout,
                                            r.batch_size)
            finding = options_finding(verdict.options)
            if finding is not None:
                verdict.findings.append(finding)
    _training_gap(r, verdict)
    verdict.findings = list(dict.fromkeys(verdict.findings))  # static and evidence may agree
    return verdict


def weights_finding(request: Diagnosis) -> Finding | None:
    """The doctor's verdict from the weights' evidence alone: the finding when another
    candidate layout fits the draft better beyond doubt, else None (OK and INCONCLUSIVE alike;
    no training gap is weighed). The serve stage and `eyas compare` ask it before any engine
    boots, so a draft the evidence faults is refused there as by the evaluate stage."""
    verdict = diagnose(replace(request, training_data=False, reported=None))
    fitted = verdict.fitted
    if fitted is None:
        return None
    recorded = next(row for row in verdict.table if row.kind == "recorded")
    return _fit_finding(fitted, recorded, verdict.weighing.better.z)


def _training_gap(r: Diagnosis, verdict: Verdict) -> None:
    """The gap alarm on the verdict being built: its finding first, or a note saying why the
    gap was not checked."""
    if not r.training_data:  # e.g. the doctor's own probe: nothing training measured applies
        verdict.notes.append(f"training gap not checked: {r.reported_missing}")
        return
    if r.reported is None:
        verdict.notes.append(f"training gap {NOT_CHECKED}: "
                             f"{r.reported_missing or 'none was given'}; give the per-position "
                             "in-vocab accuracy its trainer measured on these training shards, "
                             "e.g. --reported-accuracy 0.62,0.55,0.50")
        return
    verdict.reported = r.reported
    train_accuracy = r.train_accuracy
    if train_accuracy is None and verdict.data_layout == r.layout:
        train = open_split(r.data_dir, "train", max_samples=r.max_train_samples)
        train_accuracy = evaluate_draft(r.draft, train, r.target_head, r.steps,
                                        batch_size=r.batch_size,
                                        max_samples=r.max_train_samples)
    verdict.train_accuracy = train_accuracy
    if train_accuracy is None:
        verdict.notes.append("training gap not checked: the data's layout differs from the "
                             "draft's, so its training shards are not what it trained on")
        return
    gap = accuracy_gap(train_accuracy, r.reported, r.tolerance,
                       explained=bool(verdict.findings))
    if gap is not None:
        verdict.findings.insert(0, gap)
