"""SGLang: ids read ONLY from the draft config's `eagle_config.eagle_aux_hidden_state_layer_ids`
(a top-level key is ignored and the default [2, N//2, N-3] then applies raw).

Read in SGLang's source (models/llama.py, models/deepseek_v2.py, 0.5.x):
- Llama family: id k is the OUTPUT of layer k (it captures at the input of layer k+1);
  -1 is the embedding output; id N-1 (the last block) is never captured, silently. Captured
  in ascending layer order.
- DeepSeek-V2 family, since 0.5.13 (PR "drop +1 offset on aux layer ids when first id != 1",
  verified in 0.5.23): +1 only when the FIRST id is 1, otherwise ids are raw inputs of layers
  (0 = embedding). -1 matches nothing (a slot silently missing). Up to 0.5.12: always +1.

Worked example, the seeds' case: 60 layers, [embed, block_out:2, block_out:30]:
  Llama rule                 -> [-1, 2, 30]
  DeepSeek rule (>= 0.5.13)  -> [0, 3, 31]   (first id 0, so used raw)
  DeepSeek rule (<= 0.5.12)  -> refused: embedding not capturable
"""
from __future__ import annotations

import re

from eyas.engines import family
from eyas.layout import EMBED, FINAL_NORM, HiddenStateLayout, LayoutError, Slot

VERIFIED = "0.5.23"
_DEEPSEEK_RAW_SINCE = (0, 5, 13)  # first release after the May 2026 change (by date)
_DEEPSEEK_VERIFIED = {(0, 5, 23)}


def _version(text: str | None) -> tuple[int, int, int]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", str(text or VERIFIED))
    if not match:
        raise LayoutError(f"SGLang version {text!r} is not of the form {VERIFIED}")
    return tuple(int(x) for x in match.groups())


def deepseek_rule(version: str | None) -> str:
    v = _version(version)
    if v < _DEEPSEEK_RAW_SINCE:
        return "plus_one"
    if v in _DEEPSEEK_VERIFIED:
        return "raw_unless_first_is_1"
    raise LayoutError(
        f"SGLang {version}: its DeepSeek capture rule has not been verified (the +1 rule "
        f"changed in May 2026; verified: <= 0.5.12 always +1, {VERIFIED} raw unless the first "
        "id is 1). Read models/deepseek_v2.py and add it to eyas/engines/sglang.py")


def to_ids(layout: HiddenStateLayout, version: str | None = None) -> list[int]:
    n, names = layout.target.num_layers, layout.names
    streams = [None if s == FINAL_NORM else s.stream_index() for s in layout.draft_inputs]
    if None in streams:
        raise LayoutError(f"layout {names}: SGLang captures before the final norm; "
                          "final_norm cannot be fed to a draft")
    if n in streams:
        raise LayoutError(f"layout {names}: SGLang never captures block_out:{n - 1} (the last "
                          "block's output; config id N-1 is silently skipped); choose an "
                          "earlier block")
    if streams != sorted(streams):
        raise LayoutError(f"layout {names}: SGLang concatenates captured states in layer order; "
                          "this slot order cannot be expressed")
    if family(layout.target.architecture) == "llama":
        return [-1 if s == EMBED else s.block for s in layout.draft_inputs]
    rule = deepseek_rule(version)
    if rule == "plus_one":
        if EMBED in layout.draft_inputs:
            raise LayoutError(f"layout {names}: SGLang {version} (DeepSeek, always +1) cannot "
                              "capture the embedding output")
        return [s.block for s in layout.draft_inputs]
    if streams[0] == 1:  # raw id 1 would trigger the +1 rule; say it the +1 way instead
        raise LayoutError(
            f"layout {names}: under SGLang's DeepSeek rule a first slot of block_out:0 is "
            "inexpressible (raw id 1 is read as 'output of layer 1'); start from another slot")
    return streams


def from_ids(ids, target, version: str | None = None, verifier: Slot | None = None) -> HiddenStateLayout:
    """What SGLang feeds a draft for config ids `ids` (None: the default [2, N//2, N-3] raw)."""
    n = target.num_layers
    fam = family(target.architecture)
    if ids is None:  # the default is used without the +1: raw inputs of layers
        captured = sorted({2, n // 2, n - 3})
    elif fam == "llama" or deepseek_rule(version) == "plus_one" or ids[0] == 1:
        captured = sorted({k + 1 for k in ids})
    else:
        captured = sorted(set(ids))
    missing = [i for i in captured if not 0 <= i < n]
    if missing:
        raise LayoutError(f"SGLang ids {list(ids or [])} on a {n}-layer target: capture points "
                          f"{missing} are never reached, so those slots are silently missing")
    slots = tuple(Slot.at_stream_index(i, n) for i in captured)
    return HiddenStateLayout(target, slots, verifier or Slot("block_out", n - 1))
