"""The hidden-state layout contract: which target tensors an EAGLE-3 draft consumes.

The one rule of eyas: a hidden-state slot is never a bare integer. The same config key,
`eagle_aux_hidden_state_layer_ids`, selects different tensors in HF, vLLM, SGLang and
SpecForge. Here slots have engine-neutral names, and each engine's id list is *compiled* from
them by one function per engine (in `eyas/conventions/`), so a draft trained on
[embedding, block 2, block 30] is served with exactly those tensors.

Slot names (N = the target's number of decoder blocks, 0-based blocks):
  embed           output of the token embedding (= input of block 0)
  block_out:k     output of decoder block k: the full pre-norm residual stream, 0 <= k < N
  final_prenorm   alias of block_out:{N-1}: the last block's output before the final norm
  final_norm      the last block's output after the final norm (what HF reports last)
A config names the draft inputs, or leaves them null for the EAGLE-3 default: the blocks the
reference code's ids (2, N//2, N-3) select (`layout_from_config`, `default_layout`), or asks
for n slots spread as DFlash's SpecForge and z-lab references spread one per draft layer
(`spread_layout`).

Internally a slot sits at a residual-stream position: embed = 0, block_out:k = k + 1. The
layout also carries the target's identity, so a dataset or draft can't meet another target
revision silently, and per-slot norm fingerprints measured at extraction, so a missing or
shifted slot is visible without running a model (an embedding slot's norms are ~100x smaller
than a late block's).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from eyas.fingerprint import json_digest

SCHEMA = "eyas.layout/1"


class LayoutError(ValueError):
    """A layout that is invalid, or that does not match the other side of a boundary."""


@dataclass(frozen=True, order=True)
class Slot:
    kind: str  # "embed" | "block_out" | "final_norm"
    block: int = -1  # the decoder block for block_out, else -1

    @staticmethod
    def parse(name: str, num_layers: int) -> "Slot":
        """`"block_out:2"` -> Slot("block_out", 2); `"final_prenorm"` -> block_out:{N-1}."""
        text = str(name).strip()
        if text == "embed":
            return EMBED
        if text == "final_norm":
            return FINAL_NORM
        if text == "final_prenorm":
            return Slot("block_out", num_layers - 1)
        kind, _, index = text.partition(":")
        if kind == "block_out" and index.lstrip("-").isdigit():
            slot = Slot("block_out", int(index))
            slot.check(num_layers)
            return slot
        raise LayoutError(
            f"unknown hidden-state slot {name!r}: use embed, block_out:K (0 <= K < {num_layers}, "
            "the output of decoder block K), final_prenorm or final_norm")

    @property
    def name(self) -> str:
        return f"block_out:{self.block}" if self.kind == "block_out" else self.kind

    def check(self, num_layers: int) -> None:
        if self.kind == "block_out" and not 0 <= self.block < num_layers:
            raise LayoutError(
                f"slot {self.name} is out of range: the target has {num_layers} decoder blocks, "
                f"so block_out:K needs 0 <= K <= {num_layers - 1} "
                f"(block_out:{num_layers - 1} is the last output before the final norm)")
        if self.kind not in ("embed", "block_out", "final_norm"):
            raise LayoutError(f"unknown slot kind {self.kind!r}")

    def stream_index(self) -> int:
        """Position in the residual stream: embed = 0, block_out:k = k + 1 (final_norm: none)."""
        if self.kind == "final_norm":
            raise LayoutError("final_norm is after the final norm, not on the residual stream")
        return 0 if self.kind == "embed" else self.block + 1

    @staticmethod
    def at_stream_index(index: int, num_layers: int) -> "Slot":
        slot = EMBED if index == 0 else Slot("block_out", index - 1)
        slot.check(num_layers)
        return slot

    def describe(self, num_layers: int) -> str:
        if self.kind == "embed":
            return "embedding output"
        if self.kind == "final_norm":
            return "last block output after the final norm"
        last = ", the last, before the final norm" if self.block == num_layers - 1 else ""
        return f"output of block {self.block}{last}"


EMBED = Slot("embed")
FINAL_NORM = Slot("final_norm")


@dataclass(frozen=True)
class TargetIdentity:
    """Which target a layout's tensors came from. Fingerprints are "" where not yet known."""

    architecture: str
    num_layers: int
    hidden_size: int
    weights: str = ""
    tokenizer: str = ""
    chat_template: str = ""

    @property
    def fingerprint(self) -> str:
        return json_digest(asdict(self))

    def mismatches(self, other: "TargetIdentity") -> list[str]:
        return [f"{k}: {a!r} vs {b!r}" for k, a, b in
                ((k, getattr(self, k), getattr(other, k)) for k in asdict(self)) if a != b]


@dataclass(frozen=True)
class SlotNorms:
    """Mean and std over tokens of the per-token L2 norm of one slot."""

    mean: float
    std: float


@dataclass(frozen=True)
class HiddenStateLayout:
    target: TargetIdentity
    draft_inputs: tuple[Slot, ...]  # concatenated into the draft's fc, in this order
    verifier: Slot  # the target state the draft learns to predict from
    # measured at extraction; not part of a layout's identity (it depends on the data)
    norms: dict[str, SlotNorms] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        n = self.target.num_layers
        if not self.draft_inputs:
            raise LayoutError("a layout needs at least one draft-input slot")
        for slot in (*self.draft_inputs, self.verifier):
            slot.check(n)
        seen = set()
        for slot in self.draft_inputs:
            if slot in seen:
                raise LayoutError(
                    f"slot {slot.name} appears twice in draft_inputs "
                    f"{[s.name for s in self.draft_inputs]} (target has {n} decoder blocks); "
                    "each slot feeds the draft once")
            seen.add(slot)

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_names(cls, target: TargetIdentity, draft_inputs: list[str],
                   verifier: str = "final_prenorm") -> "HiddenStateLayout":
        """Build from slot names (null draft inputs in the config mean the default layout:
        `layout_from_config`)."""
        slots = tuple(Slot.parse(s, target.num_layers) for s in draft_inputs)
        return cls(target, slots, Slot.parse(verifier, target.num_layers))

    # -- what extraction must capture, and checks at boundaries ---------------------------
    @property
    def slots(self) -> tuple[Slot, ...]:
        """Every distinct tensor this layout needs, draft inputs first, then the verifier."""
        return tuple(dict.fromkeys((*self.draft_inputs, self.verifier)))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.draft_inputs]

    def expect_draft_inputs(self, count: int, who: str = "the draft") -> None:
        if count != len(self.draft_inputs):
            raise LayoutError(
                f"{who} expects {count} hidden-state slots but the layout has "
                f"{len(self.draft_inputs)}: {self.names} (target has "
                f"{self.target.num_layers} decoder blocks)")

    def check_matches(self, other: "HiddenStateLayout", mine: str, theirs: str) -> None:
        """Raise naming both sides when `other` differs in target or slots."""
        problems = [f"target {m}" for m in self.target.mismatches(other.target)]
        if self.draft_inputs != other.draft_inputs:
            problems.append(f"draft inputs {self.names} vs {other.names}")
        if self.verifier != other.verifier:
            problems.append(f"verifier {self.verifier.name} vs {other.verifier.name}")
        if problems:
            raise LayoutError(f"layout of {mine} does not match {theirs} ({mine} vs {theirs}): "
                              + "; ".join(problems))

    def describe(self) -> str:
        n = self.target.num_layers
        inputs = ", ".join(f"{s.name} ({s.describe(n)})" for s in self.draft_inputs)
        return (f"{self.target.architecture} with {n} blocks: draft inputs [{inputs}]; "
                f"verifier {self.verifier.name} ({self.verifier.describe(n)})")

    def with_norms(self, norms: dict[str, SlotNorms]) -> "HiddenStateLayout":
        return HiddenStateLayout(self.target, self.draft_inputs, self.verifier, dict(norms))

    # -- serialization --------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "target": asdict(self.target),
                "draft_inputs": self.names, "verifier": self.verifier.name,
                "norms": {k: [v.mean, v.std] for k, v in self.norms.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict, source: str = "layout") -> "HiddenStateLayout":
        if data.get("schema") != SCHEMA:
            raise LayoutError(f"{source}: layout schema {data.get('schema')!r} is not {SCHEMA!r}")
        try:
            target = TargetIdentity(**data["target"])
            layout = cls.from_names(target, list(data["draft_inputs"]), data["verifier"])
        except (KeyError, TypeError) as e:
            raise LayoutError(f"{source}: malformed layout ({e})") from e
        norms = {k: SlotNorms(*v) for k, v in data.get("norms", {}).items()}
        return layout.with_norms(norms)

    @classmethod
    def from_json(cls, text: str, source: str = "layout") -> "HiddenStateLayout":
        return cls.from_dict(json.loads(text), source)


# -- the EAGLE-3 default layout, and the layout a config names -----------------------------
def eagle3_default_ids(num_layers: int) -> tuple[int, int, int]:
    """The ids the EAGLE-3 reference code picks, (2, N//2, N-3), which vLLM and SGLang both
    fall back to when a draft config names none (each reads them in its own convention). In
    the reference code id k is the input of layer k: residual-stream position k."""
    return (2, num_layers // 2, num_layers - 3)


def default_layout(target: TargetIdentity, verifier: str = "final_prenorm") -> HiddenStateLayout:
    """The low/middle/high blocks the EAGLE-3 default ids select (vLLM's default too: its id
    k is the input of layer k, eyas.conventions.vllm.default_ids).

    For N = 32: ids (2, 16, 29) -> [block_out:1, block_out:15, block_out:28]. For a small
    target those ids collapse (N = 4: (2, 2, 1) -> two slots where fc expects three): then the
    slots must be named.
    """
    n = target.num_layers
    ids = eagle3_default_ids(n)
    if len(set(ids)) < 3 or min(ids) < 1:
        raise LayoutError(
            f"the target has {n} decoder blocks: vLLM's default ids {ids} collapse to "
            f"{sorted(set(i for i in ids if i >= 1))}, not three distinct slots. Name the "
            "slots explicitly, e.g. extract.layout.draft_inputs=[block_out:0,block_out:1,"
            f"block_out:{max(2, n - 2)}]")
    slots = tuple(Slot.at_stream_index(i, n) for i in sorted(ids))
    return HiddenStateLayout(target, slots, Slot.parse(verifier, n))


def spread_blocks(num_layers: int, n: int) -> list[int]:
    """The blocks whose outputs DFlash's SpecForge and z-lab references feed a draft of n
    layers (their build_target_layer_ids): one at N//2 for one layer, else n spread evenly from
    block 1 to block N-3, rounded half to even. N = 30, n = 5: [1, 8, 14, 20, 27]. (speculators'
    DFlash takes EAGLE-3's three, `default_layout`, whatever its depth.)"""
    if n == 1:
        return [num_layers // 2]
    span = num_layers - 3 - 1
    return [int(round(1 + i * span / (n - 1))) for i in range(n)]


def spread_layout(target: TargetIdentity, n: int,
                  verifier: str = "final_prenorm") -> HiddenStateLayout:
    """n draft-input slots at `spread_blocks`: `extract.layout.spread=n`."""
    if n < 1:
        raise LayoutError(f"spread {n}: name how many slots to spread, at least 1")
    blocks = spread_blocks(target.num_layers, n)
    if len(set(blocks)) < n or min(blocks) < 0:
        raise LayoutError(
            f"the target has {target.num_layers} decoder blocks: {n} slots spread from block 1 "
            f"to block {target.num_layers - 3} land on blocks {blocks}, not {n} distinct ones. "
            "Spread fewer, or name the slots (extract.layout.draft_inputs=[...])")
    return HiddenStateLayout.from_names(target, [f"block_out:{b}" for b in blocks], verifier)


def layout_from_config(target: TargetIdentity, draft_inputs: list[str] | None,
                       verifier: str = "final_prenorm",
                       spread: int | None = None) -> HiddenStateLayout:
    """The layout `extract.layout` names: its draft inputs; else `spread` slots spread as
    DFlash's references do (`spread_layout`); else `default_layout`."""
    if spread is not None and draft_inputs is not None:
        raise LayoutError(f"draft_inputs {list(draft_inputs)} and spread {spread} both name the "
                          "slots: set one (extract.layout.spread=null or "
                          "extract.layout.draft_inputs=null)")
    if spread is not None:
        return spread_layout(target, spread, verifier)
    if draft_inputs is None:
        return default_layout(target, verifier)
    return HiddenStateLayout.from_names(target, draft_inputs, verifier)
