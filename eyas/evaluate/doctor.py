"""The skew doctor: which tensors was this draft trained on, and which is it (to be) fed?

Evidence, strongest first:
- the draft evaluated on the probe split (every layer stored) under candidate layouts
  (eyas/evaluate/candidates.py): a draft fits the slots it was trained on, so the layout with
  the highest accuracy is the one its weights were trained on. Ranked by full accuracy
  averaged over the draft positions (every position depends on what fc was fed at the
  first); whether a candidate fits better (a fault), worse (OK) or within the noise
  (INCONCLUSIVE, never OK on a coin toss) is decided by paired evidence on the same tokens
  (eyas/evaluate/evidence.py), so probe noise neither raises an alarm nor passes for proof.
- features handed in (e.g. captured from a serving engine), matched to stored slots
  (eyas/evaluate/fingerprints.py): which layers the engine really reads.
- the training gap (eyas/evaluate/gap.py): what training measured while it trained not
  reproduced by the standalone run on the training shards.
- static checks: target fingerprints of draft, data and target at hand; d2t missing or the
  identity; chat template changed since prepare; verifier slot after the final norm.
Every fault is a `Finding` with a name a program can test and a message that names the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from eyas.evaluate.candidates import candidate_layouts, engine_ids, relation, slots_in_words
from eyas.evaluate.fingerprints import (HandedFeatures, SlotMatch, match_features,
                                        matched_layout, split_norms)
from eyas.evaluate.evidence import Weighing, weigh
from eyas.evaluate.findings import Finding, accuracies
from eyas.evaluate.gap import NOT_CHECKED, ReportedAccuracy, accuracy_gap
from eyas.draft.accuracy import StepAccuracy, evaluate_draft
from eyas.dataset.format import DatasetFormatError
from eyas.dataset.reader import ExtractedDataset
from eyas.extract.on_demand import open_split
from eyas.layout import FINAL_NORM, HiddenStateLayout, SlotNorms, TargetIdentity


@dataclass
class LayoutRow:
    kind: str  # "recorded" or the finding it would be
    note: str
    layout: HiddenStateLayout
    accuracy: StepAccuracy

    @property
    def score(self) -> float:
        """What candidates are ranked by: full accuracy, mean over draft positions."""
        return sum(self.accuracy.full) / len(self.accuracy.full)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "note": self.note, "draft_inputs": self.layout.names,
                "verifier": self.layout.verifier.name, "score": self.score,
                **self.accuracy.to_dict()}


@dataclass
class Verdict:
    recorded: HiddenStateLayout  # the draft's layout, from its checkpoint
    data_layout: HiddenStateLayout  # the extraction's
    findings: list[Finding] = field(default_factory=list)
    table: list[LayoutRow] = field(default_factory=list)  # candidates on the probe split
    engine_layout: HiddenStateLayout | None = None  # what handed-in features really are
    feature_matches: list[SlotMatch] = field(default_factory=list)
    probe_norms: dict[str, SlotNorms] = field(default_factory=dict)
    train_accuracy: StepAccuracy | None = None  # standalone, on the training shards
    reported: ReportedAccuracy | None = None  # what training measured while it trained
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why
    # with an engine named (engine_check): what it feeds from the draft's config, and the fix
    engine: dict | None = None
    claims: object = None  # eyas.draft.formats.Claims of the draft examined
    engine_trained: HiddenStateLayout | None = None  # the slots the engine must feed
    weighing: Weighing | None = None  # the paired evidence (eyas/evaluate/evidence.py)
    fitted: LayoutRow | None = None  # the candidate the weights fit beyond doubt, if not recorded
    inconclusive: str = ""  # why the evidence does not decide, and what would settle it

    @property
    def ok(self) -> bool:
        """No fault found AND the evidence decides: never OK on a coin toss."""
        return not self.findings and not self.inconclusive

    @property
    def status(self) -> str:
        if self.findings:
            return f"FAULT ({', '.join(dict.fromkeys(self.names))})"  # each kind once
        return "INCONCLUSIVE" if self.inconclusive else "OK"

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.findings]

    @property
    def best(self) -> LayoutRow | None:
        return max(self.table, key=lambda r: r.score) if self.table else None

    @property
    def best_layout(self) -> HiddenStateLayout | None:
        """The layout the probe evidence fits best (ties: the recorded one, listed first)."""
        return self.best.layout if self.best else None

    def explain(self) -> str:
        n = self.recorded.target.num_layers
        lines = [f"skew doctor: {self.status}",
                 f"draft layout: {self.recorded.describe()}"]
        if self.data_layout != self.recorded:
            lines.append(f"data layout:  {self.data_layout.describe()}")
        if self.table:
            positions = len(self.table[0].accuracy.full)
            counted = self.table[0].accuracy.positions[0].counted
            lines.append(f"evidence: the draft on {self.table[0].accuracy.samples} probe samples "
                         f"({counted} scored tokens) under candidate layouts; full accuracy "
                         f"at draft positions 1..{positions}, their mean, predicted tau:")
            best = self.best
            for row in self.table:
                mark = "*" if row is best else " "
                accs = " ".join(f"{a:.2f}" for a in row.accuracy.full)
                lines.append(f" {mark} {str(row.layout.names):<44} {row.layout.verifier.name:<12}"
                             f" {accs}  mean {row.score:.2f}  tau "
                             f"{row.accuracy.predicted_tau:.2f}  {row.kind}: {row.note}")
            lines.append(f"  best fit: {slots_in_words(best.layout.draft_inputs)} with verifier "
                         f"{best.layout.verifier.describe(n)}")
        for m in self.feature_matches:  # the expected slot's norms as training data had them
            seen = self.data_layout.norms.get(m.expected) or self.probe_norms.get(m.expected)
            expect = f" (training data {seen.mean:.3g}+-{seen.std:.2g})" if seen else ""
            lines.append(f"  fed slot {m.position}: norms {m.norms.mean:.3g}+-{m.norms.std:.2g}"
                         f" -> matches stored {m.best} by {m.by}; the draft expects "
                         f"{m.expected}{expect}")
        if self.train_accuracy is not None:
            lines.append(f"  training shards: in-vocab accuracy "
                         f"{accuracies(self.train_accuracy.in_vocab)} standalone"
                         + (f"; training reported {accuracies(self.reported.values)} "
                            f"({self.reported.source})" if self.reported else ""))
        if self.engine:
            lines += self.engine["lines"]
        if self.weighing is not None:
            lines.append(self.weighing.explain())
        lines += [f"- {f.name}: {f.message}" for f in self.findings]
        if self.inconclusive and not self.findings:
            lines.append(f"- inconclusive: {self.inconclusive}")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "status": self.status, "inconclusive": self.inconclusive,
                "weighing": self.weighing.to_dict() if self.weighing else None,
                "findings": [vars(f) for f in self.findings],
                "recorded": self.recorded.names, "verifier": self.recorded.verifier.name,
                "data_layout": self.data_layout.names,
                "best_layout": self.best.to_dict() if self.best else None,
                "engine_layout": self.engine_layout.names if self.engine_layout else None,
                "table": [r.to_dict() for r in self.table],
                "feature_matches": [{**vars(m), "norms": [m.norms.mean, m.norms.std]}
                                    for m in self.feature_matches],
                "probe_norms": {k: [v.mean, v.std] for k, v in self.probe_norms.items()},
                "train_accuracy": (self.train_accuracy.to_dict()
                                   if self.train_accuracy else None),
                "reported_accuracy": ({"values": self.reported.values,
                                       "source": self.reported.source}
                                      if self.reported else None),
                "notes": self.notes, "engine": self.engine, "explain": self.explain()}


def static_findings(draft_layout: HiddenStateLayout, data_layout: HiddenStateLayout, vocab,
                    target: TargetIdentity | None = None, prepared_chat_template: str = "",
                    d2t_missing: bool = False) -> list[Finding]:
    """Checks that need no model: identities, templates, vocabulary map, verifier slot."""
    out = []

    def differ(a: TargetIdentity, b: TargetIdentity) -> list[str]:
        return [m for m in a.mismatches(b) if not m.startswith("chat_template")]
    pairs = [("the draft", draft_layout.target, "the data", data_layout.target)]
    if target is not None:
        pairs.append(("the target at hand", target, "the data", data_layout.target))
    for who, a, whom, b in pairs:
        if differ(a, b):
            out.append(Finding("target_mismatch", (
                f"{who} is for target {a.fingerprint} and {whom} came from target "
                f"{b.fingerprint} ({'; '.join(differ(a, b))}); a draft is only evaluated "
                "and served with its own target: re-extract or retrain for one of them")))
    templates = {"prepare": prepared_chat_template, "extraction": data_layout.target.chat_template,
                 "the draft": draft_layout.target.chat_template,
                 "the target's tokenizer now": target.chat_template if target else ""}
    known = {k: v for k, v in templates.items() if v}
    if len(set(known.values())) > 1:
        out.append(Finding("chat_template_changed", (
            "the chat template changed between prepare and evaluation ("
            + ", ".join(f"{k}: {v}" for k, v in known.items()) + "): prompts are rendered "
            "differently from the training data, so the draft sees text it was not trained on; "
            "re-run prepare (and the later stages) with the current template, or restore it")))
    ids_note = ("vLLM will map draft ids to the wrong target tokens (draft id i served as "
                "target token i): re-save the draft with the d2t built from its training "
                "data (eyas.draft.vocab.build_vocab)")
    if d2t_missing:
        out.append(Finding("d2t_missing", f"the checkpoint has no d2t tensor: {ids_note}"))
    elif vocab.size < vocab.target_vocab_size and not bool(vocab.d2t.any()):
        out.append(Finding("d2t_identity", (
            f"d2t is all zeros (the identity) although the draft vocab ({vocab.size}) is smaller "
            f"than the target's ({vocab.target_vocab_size}): {ids_note}")))
    if FINAL_NORM in (draft_layout.verifier, data_layout.verifier):
        out.append(Finding("postnorm_verifier", _postnorm(draft_layout)))
    return out


def _postnorm(layout: HiddenStateLayout) -> str:
    last = f"block_out:{layout.target.num_layers - 1}"
    return ("the draft was trained against the target's state AFTER the final norm "
            "(final_norm; the trainer's target head applies the norm again), not the last block "
            f"output before it ({last}): its targets were not the target's tokens. Extract with "
            "extract.layout.verifier=final_prenorm and retrain")


def _fit_finding(fitted: LayoutRow, recorded: LayoutRow, z: float) -> Finding:
    if fitted.kind == "postnorm_verifier":
        return Finding(fitted.kind, _postnorm(fitted.layout))
    got, want = fitted.layout, recorded.layout
    return Finding(fitted.kind, (
        f"the draft's weights fit {slots_in_words(got.draft_inputs)} (mean accuracy "
        f"{fitted.score:.3f}), not the {slots_in_words(want.draft_inputs)} its checkpoint "
        f"records ({recorded.score:.3f}), beyond doubt (paired z {z:+.1f}): it was trained on "
        "other slots than its data says (e.g. HF hidden_states[k] read as the output of block "
        "k). Re-extract with the layout named by slots and retrain, or serve it as what it "
        f"is: {engine_ids(got)}"))


def fed_slots_finding(trained: HiddenStateLayout, fed: HiddenStateLayout | None,
                      nearest: list[str], worst: float = 0.0, tolerance: float | None = None,
                      numerics: str = "") -> Finding | None:
    """What is wrong with the tensors something (an engine) feeds the draft, or None.

    `fed`: the layout those tensors matched (None: two of them match one stored slot;
    `nearest` then lists each one's nearest stored slot); `worst`: the largest relative
    error of a fed tensor against the stored slot it matched, held to `tolerance` when one
    is given (see fingerprints.parity_tolerance; `numerics` says which dtypes set it)."""
    if fed is None:
        return Finding("other_slots", (
            f"the fed tensors match no consistent layout (nearest stored slots {nearest}): the "
            f"engine feeds a slot twice; the draft was trained on {slots_in_words(trained.draft_inputs)}"))
    kind = relation(trained, fed)
    if kind != "same":
        return Finding(kind, (
            f"the engine feeds {slots_in_words(fed.draft_inputs)}; the draft was trained on "
            f"{slots_in_words(trained.draft_inputs)}; compile the layout for this engine with "
            f"{engine_ids(trained)} and write them in the draft config "
            "(eyas.draft.checkpoint.save_draft writes both places vLLM reads)"))
    if tolerance is not None and worst > tolerance:  # the right slots: no id list fixes this
        return Finding("values_differ", (
            f"the engine feeds the slots the draft was trained on "
            f"({slots_in_words(trained.draft_inputs)}), but their values differ from the stored ones by "
            f"up to {worst:.1e} relative (tolerance {tolerance:.1e} for {numerics}): the engine "
            "runs another revision of the target, or other numerics, than the extraction did; "
            "serve the target the data was extracted from, in the extraction's dtype"))
    return None


def diagnose(draft, draft_layout: HiddenStateLayout, data_dir, target_head=None, *,
             steps: int = 3, features: HandedFeatures | None = None, reported=None,
             tolerance: float = 0.05,
             target: TargetIdentity | None = None, prepared_chat_template: str = "",
             d2t_missing: bool = False, train_accuracy: StepAccuracy | None = None,
             max_train_samples: int | None = None, batch_size: int = 8,
             reported_missing: str = "", training_data: bool = True) -> Verdict:
    """Everything the doctor can tell about `draft` (with its checkpoint's layout) and the
    extraction at `data_dir`. `target_head` (the target's final norm + lm_head) enables the
    accuracy evidence; `reported` (what training measured per position while it trained: a
    list or a gap.ReportedAccuracy) the gap alarm; without it a note says the gap was not
    checked, and why (`reported_missing`). `training_data=False`: `data_dir` is not what the
    draft trained on (the doctor's own probe), so no gap is checked."""
    try:
        probe, has_probe = ExtractedDataset(data_dir, "probe"), True
    except DatasetFormatError:  # extracted with probe_samples=0: fewer layouts can be tried
        probe, has_probe = open_split(data_dir, "heldout"), False
    data_layout = probe.layout
    stored = set(probe[0].slots)
    verdict = Verdict(draft_layout, data_layout, static_findings(
        draft_layout, data_layout, draft.vocab, target, prepared_chat_template, d2t_missing))
    if not has_probe:
        verdict.notes.append("no probe set (every layer) in the data: only layouts built from "
                             f"the stored slots {sorted(stored)} were tried; extract with "
                             "extract.probe_samples > 0 for the full evidence")
    same_shape = (draft_layout.target.num_layers, draft_layout.target.hidden_size) == (
        data_layout.target.num_layers, data_layout.target.hidden_size)
    if not same_shape:
        verdict.notes.append("draft and data targets differ in shape: no accuracy evidence")
        return verdict
    kind = relation(draft_layout, data_layout)
    if kind != "same":
        verdict.findings.append(Finding(kind, (
            f"the draft's checkpoint records {draft_layout.names} (verifier "
            f"{draft_layout.verifier.name}) but the data records {data_layout.names} (verifier "
            f"{data_layout.verifier.name}): evaluate and serve a draft with the layout it was "
            "trained on")))
    verdict.probe_norms = split_norms(probe)
    if features is not None:
        verdict.feature_matches = match_features(features, draft_layout, probe,
                                                 verdict.probe_norms)
        fed = matched_layout(verdict.feature_matches, draft_layout)
        verdict.engine_layout = fed
        finding = fed_slots_finding(draft_layout, fed, [m.best for m in verdict.feature_matches])
        if finding is not None:
            verdict.findings.append(finding)
    if target_head is None:
        verdict.notes.append("no target head given: the accuracy evidence was not gathered")
        return verdict
    for c in candidate_layouts(draft_layout):
        if not {s.name for s in c.layout.slots} <= stored:
            continue
        acc = evaluate_draft(draft, probe, target_head, steps, c.layout, batch_size)
        verdict.table.append(LayoutRow(c.kind, c.note, c.layout, acc))
    recorded = next((r for r in verdict.table if r.kind == "recorded"), None)
    if recorded is not None:  # is the evidence conclusive? (eyas/evaluate/evidence.py)
        others = [r for r in verdict.table if r is not recorded]
        verdict.weighing = weigh(draft, probe, target_head, recorded.layout,
                                 [(r.layout, r.kind) for r in others], batch_size)
        better = verdict.weighing.better
        if better is not None:
            verdict.fitted = next(r for r in others if r.layout.names == better.names
                                  and r.kind == better.kind)
            verdict.findings.append(_fit_finding(verdict.fitted, recorded, better.z))
        elif not verdict.weighing.conclusive:
            verdict.inconclusive = verdict.weighing.what_would_settle_it()
    if not training_data:  # e.g. the doctor's own probe: nothing training measured applies
        verdict.notes.append(f"training gap not checked: {reported_missing}")
    elif reported is None:
        verdict.notes.append(f"training gap {NOT_CHECKED}: "
                             f"{reported_missing or 'none was given'}; give the per-position "
                             "in-vocab accuracy its trainer measured on these training shards, "
                             "e.g. --reported-accuracy 0.62,0.55,0.50")
    else:
        verdict.reported = (reported if isinstance(reported, ReportedAccuracy)
                            else ReportedAccuracy.given(reported))
        if train_accuracy is None and data_layout == draft_layout:
            train = open_split(data_dir, "train", max_samples=max_train_samples)
            train_accuracy = evaluate_draft(draft, train, target_head, steps,
                                            batch_size=batch_size, max_samples=max_train_samples)
        verdict.train_accuracy = train_accuracy
        if train_accuracy is None:
            verdict.notes.append("training gap not checked: the data's layout differs from the "
                                 "draft's, so its training shards are not what it trained on")
        gap = (accuracy_gap(train_accuracy, verdict.reported, tolerance,
                             explained=bool(verdict.findings))
               if train_accuracy else None)
        if gap is not None:
            verdict.findings.insert(0, gap)
    verdict.findings = list(dict.fromkeys(verdict.findings))  # static and evidence may agree
    return verdict


def engine_check(verdict: Verdict, claims, fed, why: str, engine: str,
                 version: str | None = None) -> None:
    """Add to `verdict` what `engine` will feed the draft from its config (`fed`, an
    eyas.draft.formats.feed.EngineFeed) against the slots it was trained on: the recorded
    (or, where the config says nothing, tested) layout, or the one the evidence table fits
    instead when the doctor found that (the table's own rule, unchanged). A feed that differs,
    or a config the engine would crash on, is the finding `engine_feed`, with the ids to write."""
    from eyas.draft.formats.feed import ids_to_write
    from eyas.layout import LayoutError

    refit = verdict.fitted is not None
    trained = verdict.fitted.layout if refit else verdict.recorded
    how = ("the layout the evidence table fits, not the one tested first" if refit else
           "as the config says" if claims.layout is not None else
           "not said by the config; the layout tested, which the evidence table did not reject")
    lines = [f"format: {claims.format}; trained on: {why}"]
    lines += [f"  {note}" for note in claims.notes]
    feeds = (slots_in_words(fed.layout.draft_inputs) if fed.layout is not None
             else "nothing it can use")
    reads = f"reads ids {fed.ids}" if fed.ids else "reads no ids"
    lines.append(f"engine: {fed.engine} {reads} ({fed.where}) and feeds {feeds}")
    lines += [f"  would fail: {p}" for p in fed.problems]
    try:
        keys, words = ids_to_write(trained, engine, version)
        fix = f"write {words} (--write-fixed DIR writes that config beside the weights)"
    except LayoutError as e:
        keys, fix = None, f"no id list makes {fed.engine} feed them: {e}"
    same = fed.layout is not None and fed.layout.draft_inputs == trained.draft_inputs
    if same and not fed.problems:
        lines.append(f"engine: OK, {fed.engine} feeds the slots the draft was trained on "
                     f"({slots_in_words(trained.draft_inputs)}, {how})")
        if claims.layout is None:
            lines.append(f"  the config names no ids for them: {fix}")
    else:
        what = (f"feeds {feeds}" if not same else "feeds the right slots")
        verdict.findings.append(Finding("engine_feed", (
            f"{fed.engine} {what} but the draft was trained on "
            f"{slots_in_words(trained.draft_inputs)} ({how})"
            + (f"; {'; '.join(fed.problems)}" if fed.problems else "") + f": {fix}")))
    verdict.engine = {"engine": fed.engine, "reads": fed.ids, "where": fed.where,
                      "feeds": fed.layout.names if fed.layout is not None else None,
                      "problems": fed.problems, "trained": trained.names, "how": how,
                      "write": keys, "lines": lines}
    verdict.claims, verdict.engine_trained = claims, trained
