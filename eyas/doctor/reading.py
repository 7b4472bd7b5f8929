"""What a draft's config.json says, read without its weights' values: the kind of draft, the
slots it claims to have been trained on, what every engine runner feeds it
(eyas/conventions/feeds.py), and what the config leaves undecided. eyas/doctor/static.py reads
it and judges it; a `Verdict` (eyas/doctor/verdict.py) carries it, alone (the config-only
doctor) or beside the weights' evidence (its runner lines).
"""
from __future__ import annotations

from dataclasses import dataclass

from eyas.conventions.feeds import Feed, hf_indices
from eyas.conventions.kinds import DraftKind
from eyas.layout import Slot, TargetIdentity


@dataclass
class ConfigReading:
    draft: str  # the config.json read
    kind: DraftKind
    target: TargetIdentity
    target_vocab: int | None
    claimed: list[str] | None  # the slots the config says the draft was trained on
    says: str  # how it says so, in words
    feeds: list[Feed]  # every runner's, in eyas.conventions.rules.RUNNERS order
    weights_fc: int | None  # states the weights' fc takes (None: no weights at hand)
    undecided: str = ""  # what the config leaves open, and the question that settles it
    assumed: str = ""  # the vLLM runner the deployment uses, and why; "": both are held to it
    target_positions: int | None = None  # the target's max_position_embeddings
    tensor_names: list[str] | None = None  # the weights' (None: no weights at hand)

    @property
    def family(self) -> str:
        return self.kind.name

    def lines(self) -> list[str]:
        """The draft, the target, what the config claims and what each runner feeds."""
        t = self.target
        lines = [f"draft: {self.draft} ({self.family}); target {t.architecture}, "
                 f"{t.num_layers} layers, hidden {t.hidden_size}",
                 *([f"assumed: {self.assumed}"] if self.assumed else []),
                 f"trained on (the config says): "
                 f"{self.claimed if self.claimed is not None else 'unknown'} ({self.says})"]
        for f in self.feeds:
            if f.refused:
                would = (f"; as written it would feed {f.slots}, from {f.where}"
                         if f.slots is not None else "")
                lines.append(f"{f.label}: does not serve it: {f.refused}{would}")
                continue
            fed = f"feeds {f.slots}" if f.slots is not None else "feeds nothing it can use"
            lines.append(f"{f.label}: {fed}, from {f.where}")
            lines += [f"  would fail: {p}" for p in f.problems]
        return lines

    def to_dict(self) -> dict:
        t = self.target
        n = t.num_layers
        claimed_stream = (None if self.claimed is None else
                          [Slot.parse(s, n).stream_index() if s != "final_norm" else n
                           for s in self.claimed])
        return {"draft": self.draft, "family": self.family, "eyas_trains_it": self.kind.readable,
                "target": {"architecture": t.architecture, "num_layers": n,
                           "hidden_size": t.hidden_size, "vocab_size": self.target_vocab},
                "claimed": {"slots": self.claimed, "says": self.says,
                            "hf_hidden_states": None if claimed_stream is None
                            else hf_indices(claimed_stream, n)},
                "weights_fc_states": self.weights_fc,
                "engines": [f.to_dict() for f in self.feeds]}
