"""The engine check: what an engine will feed the draft from its config (its runner's `Feed`,
eyas/conventions/feeds.py) against the slots it was trained on, and the ids to write when
they differ.

`engine_check` reads, it does not mutate: it returns an `EngineCheck`, which
`Verdict.with_engine` (eyas/doctor/verdict.py) adds to a verdict, its finding included.
"""
from __future__ import annotations

from dataclasses import dataclass

from eyas.conventions.engines import engine_rules, ids_to_write
from eyas.conventions.feeds import Feed, engine_feed
from eyas.conventions.kinds import draft_kind
from eyas.doctor.candidates import slots_in_words
from eyas.doctor.findings import Finding
from eyas.draft.claims import Claims, FormatError
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity


def claims_feed(claims: Claims, target: TargetIdentity, engine: str,
                version: str | None = None) -> Feed:
    """What `engine` at `version` feeds the draft from its config as the engine reads it (a
    speculators config: as vLLM converts it), its weights' fc width and d2t included."""
    if claims.model_args.get("mla") and not engine_rules(engine).reads_mla_drafts:
        raise FormatError(f"an MLA (Eagle3DeepseekV2/V3) draft: eyas has read how vLLM serves "
                          f"it (deepseek_eagle3.py), not {engine}; examine it with --engine "
                          "vllm")
    config = claims.view.config
    return engine_feed(config, draft_kind(config), target, engine, version,
                       weights_fc=claims.num_aux, has_d2t=claims.has_d2t)


@dataclass(frozen=True)
class EngineCheck:
    """What an engine feeds the draft from its config, against the slots it was trained on."""

    claims: Claims  # what the draft's config says (eyas.draft.eagle3.formats)
    why: str  # why the doctor tested the layout it tested first, in words
    fed: Feed  # the ids the engine's runner reads, from where, and what it feeds
    trained: HiddenStateLayout  # the slots the engine must feed
    how: str  # how `trained` was established, in words
    write: dict | None  # the config keys that make the engine feed `trained`; None: no ids can
    fix: str  # the fix in words: the keys to write, or why no id list makes the engine feed them

    @property
    def engine(self) -> str:
        return self.fed.runner.engine

    @property
    def version(self) -> str | None:
        return self.fed.version

    @property
    def problems(self) -> list[str]:
        """What would crash or be misread, whatever the slots (or why it serves nothing)."""
        refused = [f"it does not serve this draft: {self.fed.refused}"] if self.fed.refused else []
        return refused + self.fed.problems

    @property
    def feeds_trained(self) -> bool:
        """The engine feeds the slots the draft was trained on (whether or not it would crash)."""
        return (self.fed.layout is not None
                and self.fed.layout.draft_inputs == self.trained.draft_inputs)

    @property
    def ok(self) -> bool:
        return self.feeds_trained and not self.problems

    @property
    def feeds(self) -> str:
        """What the engine feeds, in words."""
        return (slots_in_words(self.fed.layout.draft_inputs) if self.fed.layout is not None
                else "nothing it can use")

    @property
    def finding(self) -> Finding | None:
        """"engine_feed" when the engine feeds other slots, or would crash on the config."""
        if self.ok:
            return None
        what = f"feeds {self.feeds}" if not self.feeds_trained else "feeds the right slots"
        problems = f"; {'; '.join(self.problems)}" if self.problems else ""
        return Finding("engine_feed", (
            f"{self.fed.label} {what} but the draft was trained on "
            f"{slots_in_words(self.trained.draft_inputs)} ({self.how}){problems}: {self.fix}"))

    @property
    def lines(self) -> list[str]:
        """The verdict's lines about the engine (its finding is listed with the others)."""
        fed = self.fed
        lines = [f"format: {self.claims.format}; trained on: {self.why}"]
        lines += [f"  {note}" for note in self.claims.notes]
        reads = f"reads ids {fed.ids}" if fed.ids else "reads no ids"
        lines.append(f"engine: {fed.label} {reads} ({fed.where}) and feeds {self.feeds}")
        lines += [f"  would fail: {p}" for p in self.problems]
        if self.ok:
            lines.append(f"engine: OK, {fed.label} feeds the slots the draft was trained on "
                         f"({slots_in_words(self.trained.draft_inputs)}, {self.how})")
            if self.claims.layout is None:
                lines.append(f"  the config names no ids for them: {self.fix}")
        return lines

    def to_dict(self) -> dict:
        fed = self.fed
        return {"engine": fed.label, "reads": fed.ids, "where": fed.where,
                "feeds": fed.layout.names if fed.layout is not None else None,
                "problems": self.problems, "trained": self.trained.names, "how": self.how,
                "write": self.write, "lines": self.lines}


def engine_check(claims: Claims, fed: Feed, why: str, *, recorded: HiddenStateLayout,
                 fitted: HiddenStateLayout | None = None) -> EngineCheck:
    """What the engine will feed the draft from its config (`fed`, from `claims_feed`)
    against the slots it was trained on: the `recorded` layout (what the config says or,
    where it says nothing, the one the doctor tested), or the one the evidence table `fitted`
    instead when the doctor found that (the table's own rule, unchanged). A feed that
    differs, or a config the engine would crash on, is the finding `engine_feed`, with the
    ids to write."""
    trained = fitted if fitted is not None else recorded
    how = ("the layout the evidence table fits, not the one tested first" if fitted is not None
           else "as the config says" if claims.layout is not None else
           "not said by the config; the layout tested, which the evidence table did not reject")
    try:
        keys, words = ids_to_write(trained, fed.runner.engine, fed.version)
        fix = f"write {words} (--write-fixed DIR writes that config beside the weights)"
    except LayoutError as e:
        keys, fix = None, f"no id list makes {fed.label} feed them: {e}"
    return EngineCheck(claims, why, fed, trained, how, keys, fix)
