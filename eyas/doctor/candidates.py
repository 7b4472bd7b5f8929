"""The alternative layouts the skew doctor tries, how two layouts relate, and the fix in words.

Candidates are built from a recorded layout [s_1..s_n] + verifier v (N = decoder blocks):
  recorded            as recorded
  shifted             each slot alone moved by +/-1 block, and all slots moved together
  missing_embedding   embed dropped, a later block appended (at the layout's own spacing, and
                      the last block): e.g. a draft trained on [embed, block_out:2,
                      block_out:30] that an engine feeds [block_out:2, block_out:30,
                      block_out:58] (its default ids, which never read the embedding);
                      and the reverse, for a layout without embed: embed first, the last
                      slot dropped (the config says [block_out:1, block_out:14,
                      block_out:26]; the draft was trained on [embed, block_out:1,
                      block_out:14]: the seeds' mistake)
  permuted            the same slots in another order (every order, up to 4 slots)
  postnorm_verifier   the verifier read after the final norm (final_norm) instead of before
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

from eyas.conventions import vllm
from eyas.layout import EMBED, FINAL_NORM, HiddenStateLayout, LayoutError, Slot

LAYOUT_FINDINGS = ("missing_embedding", "shifted", "permuted", "postnorm_verifier",
                   "other_slots")


@dataclass(frozen=True)
class Candidate:
    kind: str  # "recorded" or one of LAYOUT_FINDINGS
    layout: HiddenStateLayout
    note: str  # e.g. "all slots +1"


def slots_in_words(slots) -> str:
    """[embed, block_out:2] -> "[embedding, block 2]": how the fix is said to a person."""
    def one(s: Slot) -> str:
        return {"embed": "embedding", "final_norm": "final-norm output"}.get(
            s.kind, f"block {s.block}")
    return "[" + ", ".join(one(s) for s in slots) + "]"


def _moved(slot: Slot, by: int, n: int) -> Slot | None:
    if slot.kind == "final_norm":
        return None
    index = slot.stream_index() + by
    return Slot.at_stream_index(index, n) if 0 <= index <= n else None


def _layout(base: HiddenStateLayout, slots, verifier: Slot | None = None):
    if None in slots or len(set(slots)) != len(slots):
        return None
    return HiddenStateLayout(base.target, tuple(slots), verifier or base.verifier)


def candidate_layouts(recorded: HiddenStateLayout) -> list[Candidate]:
    n = recorded.target.num_layers
    slots = list(recorded.draft_inputs)
    found: list[Candidate] = [Candidate("recorded", recorded, "as recorded")]

    def add(kind, layout, note):
        if layout is not None and all(c.layout != layout for c in found):
            found.append(Candidate(kind, layout, note))

    for by in (1, -1):
        add("shifted", _layout(recorded, [_moved(s, by, n) for s in slots]),
            f"all slots {by:+d}")
        for i, s in enumerate(slots):
            add("shifted", _layout(recorded, slots[:i] + [_moved(s, by, n)] + slots[i + 1:]),
                f"{s.name} {by:+d}")
    if EMBED in slots and len(slots) > 1:
        rest = [s for s in slots if s != EMBED]
        last = rest[-1].stream_index()
        spacing = last - rest[-2].stream_index() if len(rest) > 1 else 1
        for index in dict.fromkeys((last + spacing, n)):
            if last < index <= n:
                add("missing_embedding", _layout(recorded, rest + [Slot.at_stream_index(index, n)]),
                    "embed dropped, a later block appended")
    if EMBED not in slots and len(slots) > 1:  # the seeds' mistake, as served: trained with
        # the embedding first and every slot one place later than the config says
        add("missing_embedding", _layout(recorded, [EMBED] + slots[:-1]),
            "embed first, every slot one place later")
    if len(slots) <= 4:
        for order in permutations(slots):
            add("permuted", _layout(recorded, list(order)), "slots reordered")
    add("postnorm_verifier", _layout(recorded, slots, FINAL_NORM), "verifier after final norm")
    return found


def relation(recorded: HiddenStateLayout, other: HiddenStateLayout) -> str:
    """How `other` differs from `recorded`: "same" or one of LAYOUT_FINDINGS."""
    a, b = recorded.draft_inputs, other.draft_inputs
    if a == b:
        if recorded.verifier == other.verifier:
            return "same"
        return "postnorm_verifier" if other.verifier == FINAL_NORM else "other_slots"
    if sorted(a) == sorted(b):
        return "permuted"
    if len(a) == len(b) and FINAL_NORM not in (*a, *b):
        moves = {y.stream_index() - x.stream_index() for x, y in zip(a, b)}
        if moves <= {-1, 0, 1}:
            return "shifted"
    if (EMBED in a) != (EMBED in b):
        return "missing_embedding"
    return "other_slots"


def engine_ids(layout: HiddenStateLayout) -> str:
    """The vLLM ids that serve `layout`, or why none can."""
    try:
        return f"vLLM ids (eyas.conventions.vllm.to_ids) {vllm.to_ids(layout)}"
    except LayoutError as e:
        return f"no vLLM id list serves it ({e})"
