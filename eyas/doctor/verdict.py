"""The doctor's verdict, its one type: the findings, what the draft's config says and every
runner feeds (`reading`, eyas/doctor/reading.py), the weights' evidence behind them when the
target and data were at hand (`recorded` and the table; the config-only doctor,
eyas/doctor/static.py, is the doctor without it), and how it is said (explain, to_dict);
`SkewAlarm`, the verdict raised when a stage must stop on it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from eyas.doctor.candidates import slots_in_words
from eyas.doctor.engine import EngineCheck
from eyas.doctor.evidence import MIN_ACCURACY, Comparison, Weighing
from eyas.conventions.feeds import Feed
from eyas.doctor.reading import ConfigReading
from eyas.doctor.findings import Finding, accuracies
from eyas.doctor.fingerprints import SlotMatch, matched_layout
from eyas.doctor.gap import ReportedAccuracy
from eyas.draft.accuracy import StepAccuracy
from eyas.layout import HiddenStateLayout, SlotNorms


@dataclass
class LayoutRow:
    """One candidate layout of the evidence table: the draft's accuracy on the probe under it."""

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
    # with the weights' evidence: the layout the draft was examined with (its checkpoint's);
    # None: the config-only doctor
    recorded: HiddenStateLayout | None = None
    data_layout: HiddenStateLayout | None = None  # the extraction's
    findings: list[Finding] = field(default_factory=list)
    table: list[LayoutRow] = field(default_factory=list)  # candidates on the probe split
    weighing: Weighing | None = None  # the paired evidence (eyas/doctor/evidence.py)
    feature_matches: list[SlotMatch] = field(default_factory=list)  # handed-in features
    probe_norms: dict[str, SlotNorms] = field(default_factory=dict)
    train_accuracy: StepAccuracy | None = None  # standalone, on the training shards
    reported: ReportedAccuracy | None = None  # what training measured while it trained
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why
    engine: EngineCheck | None = None  # with an engine named: what it feeds, and the fix
    reading: ConfigReading | None = None  # what the config says and every runner feeds
    options: list[Comparison] = field(default_factory=list)  # norm options flipped (options.py)

    @property
    def evidence(self) -> bool:
        """The weights' evidence was weighed (not the config-only doctor)."""
        return self.recorded is not None

    @property
    def runners(self) -> list[Feed]:
        """Every engine runner's feed (none where the config was not read)."""
        return self.reading.feeds if self.reading is not None else []

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
    def unpredictive(self) -> bool:
        """The draft predicts next to none of the target's tokens under any candidate layout
        (eyas/doctor/evidence.py MIN_ACCURACY): its weights carry no evidence of its slots."""
        return bool(self.table) and max(r.accuracy.full[0] for r in self.table) < MIN_ACCURACY

    @property
    def fitted(self) -> LayoutRow | None:
        """The candidate the weights fit better than the recorded layout beyond doubt."""
        better = self.weighing.better if self.weighing is not None else None
        if better is None or self.unpredictive:
            return None
        return next(r for r in self.table if r.kind == better.kind
                    and r.layout.names == better.names)

    @property
    def inconclusive(self) -> str:
        """Why the evidence does not decide, and what would settle it; "" where it decides
        (config only: what the config leaves undecided)."""
        if not self.evidence:
            return self.reading.undecided if self.reading is not None else ""
        w = self.weighing
        if w is not None and self.unpredictive:
            best = max(r.accuracy.full[0] for r in self.table)
            return (f"the draft predicts {best:.1%} of the target's tokens at draft position 1 "
                    f"under its best layout (under {MIN_ACCURACY:.0%} under every one): its "
                    "weights say nothing about which slots it was trained on; check that it "
                    "is a draft for this target (its lm_head, d2t and vocabulary)")
        if w is None or w.better is not None or w.conclusive:
            return ""
        return w.what_would_settle_it() + self._what_the_undecided_cost()

    def _what_the_undecided_cost(self) -> str:
        """The predicted tau on the probe under the recorded layout and under each candidate
        the evidence cannot tell from it: where they are alike, a skew among them would cost
        about that little; where they are not, more evidence matters."""
        # by kind too: a candidate with the recorded draft inputs and another verifier
        # has the same names
        rows = {(r.kind, tuple(r.layout.names)): r for r in self.table}
        recorded = next((r for r in self.table if r.kind == "recorded"), None)
        costs = [(c.names, rows[c.kind, tuple(c.names)].accuracy.predicted_tau)
                 for c in self.weighing.undecided[:4] if (c.kind, tuple(c.names)) in rows]
        if recorded is None or not costs:
            return ""
        base = recorded.accuracy.predicted_tau
        return ("; what they would cost (predicted tau on the probe): recorded "
                f"{base:.2f}, " + ", ".join(f"{names} {tau:.2f} ({tau - base:+.2f})"
                                            for names, tau in costs))

    @property
    def engine_layout(self) -> HiddenStateLayout | None:
        """What the handed-in features really are; None without features, or where two of
        them match one stored slot."""
        return (matched_layout(self.feature_matches, self.recorded) if self.feature_matches
                else None)

    @property
    def best(self) -> LayoutRow | None:
        return max(self.table, key=lambda r: r.score) if self.table else None

    @property
    def best_layout(self) -> HiddenStateLayout | None:
        """The layout the probe evidence fits best (ties: the recorded one, listed first)."""
        return self.best.layout if self.best else None

    def with_engine(self, check: EngineCheck) -> "Verdict":
        """This verdict with the engine check added: its lines, and its finding if any."""
        finding = check.finding
        return dataclasses.replace(self, engine=check,
                                   findings=self.findings + ([finding] if finding else []))

    def with_runners(self, static: "Verdict") -> "Verdict":
        """This verdict with what every engine runner feeds (the config-only verdict on the
        same draft and target), and its finding when vLLM's two runners disagree."""
        disagree = [f for f in static.findings if f.name == "runners_disagree"]
        return dataclasses.replace(self, reading=static.reading,
                                   findings=self.findings + disagree)

    def explain(self) -> str:
        if not self.evidence:
            return self._explain_config()
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
            lines += self.engine.lines
        lines += [f"  {r.line()}" for r in self.runners]
        if self.weighing is not None:
            lines.append(self.weighing.explain())
        if self.options:
            lines.append("norm options: the config's setting against each flipped, at draft "
                         "position 2: " + "; ".join(f"{c.kind} {c.mean_gap:+.3f} nats/token "
                                                    f"z {c.z:+.1f}" for c in self.options))
        lines += [f"- {f.name}: {f.message}" for f in self.findings]
        if self.inconclusive and not self.findings:
            lines.append(f"- inconclusive: {self.inconclusive}")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def _explain_config(self) -> str:
        lines = [f"skew doctor (config only): {self.status}", *self.reading.lines()]
        lines += [f"- {f.name}: {f.message}" for f in self.findings]
        if self.inconclusive:
            lines.append(f"- undecided: {self.inconclusive}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        if not self.evidence:
            return {"status": self.status, "ok": self.ok, **self.reading.to_dict(),
                    "findings": [vars(f) for f in self.findings],
                    "undecided": self.inconclusive, "assumed_runner": self.reading.assumed or None,
                    "notes": self.notes, "explain": self.explain()}
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
                "notes": self.notes, "engine": self.engine.to_dict() if self.engine else None,
                "runners": [r.to_dict() for r in self.runners],
                "options": [{"flipped": c.kind, "mean_gap": c.mean_gap, "z": c.z}
                            for c in self.options],
                "explain": self.explain()}


class SkewAlarm(RuntimeError):
    """Train/serve (or train/evaluate) skew found; `.verdict` is the doctor's diagnosis."""

    def __init__(self, verdict: Verdict):
        self.verdict = verdict
        super().__init__(verdict.explain())
