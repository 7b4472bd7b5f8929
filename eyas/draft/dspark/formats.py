"""The DSpark family's draft formats, for eyas.draft.load (`READERS`, `build`): eyas's own
DSpark drafts (eyas.draft.dspark.checkpoint writes them: `eyas_family` "dspark" with
`eyas_layout` and `eyas_model_args`), read as DFlash's own format is
(eyas.draft.dflash.formats) with DSpark's config keys and tensors
(eyas.conventions.vllm_dspark). Other trainers' DSpark drafts are not read: the doctor's
--static examination says what each engine feeds them.
"""
from __future__ import annotations

from eyas.conventions import vllm_dspark
from eyas.draft.claims import Claims
from eyas.draft.dflash import formats as dflash
from eyas.draft.dflash.formats import tensor_shapes  # noqa: F401  (eyas.draft.load reads it)
from eyas.draft.dspark.model import DSparkConfig, DSparkDraft


class Own(dflash.Own):
    """eyas's own DSpark format."""

    family = "dspark"
    conventions = vllm_dspark


READERS = (Own,)


def _dspark(args: dict, embedding, vocab) -> DSparkDraft:
    return DSparkDraft(DSparkConfig(**args), embedding, vocab)


def build(path, claims: Claims, target_embedding, where: str, checked: bool = True
          ) -> tuple[DSparkDraft, bool]:
    """(the draft as vLLM would serve it, d2t_missing); `checked`: held to its own record
    first (the ids it feeds compile from its layout; exactly vLLM's tensors)."""
    return dflash.build(path, claims, target_embedding, where, checked,
                        weight_shapes=vllm_dspark.weight_shapes, make=_dspark)
