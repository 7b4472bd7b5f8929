"""P-EAGLE draft formats (an entry of eyas.draft.load's FAMILIES, read before EAGLE-3's):

  own      eyas's: a LlamaForCausalLMEagle3 config with `eyas_family: "peagle"`, eyas_layout,
           eyas_model_args (eyas.draft.peagle.checkpoint writes it)
  foreign  any other LlamaForCausalLMEagle3 config with a mask token id where vLLM's parallel
           drafter reads one (`mask_token_id`, `pard_token`, `ptd_token_id`,
           `dflash_config.mask_token_id`): its ids read as EAGLE-3's are
           (eyas.draft.eagle3.formats.eagle3)

Both read what vLLM reads (eyas.conventions.vllm_checkpoint): EAGLE-3's layer 0 and options,
`num_hidden_layers` (later layers as `layers.{i}.*`), the mask id, and a `mask_hidden` tensor
(vLLM refuses parallel drafting without one).
"""
from __future__ import annotations

from eyas.conventions.vllm_checkpoint import peagle_weight_shapes
from eyas.draft.weights import assemble
from eyas.draft.eagle3.formats import own as eagle3_own
from eyas.draft.claims import Claims
from eyas.draft.weights import read_tensors
from eyas.draft.peagle.formats import foreign, own
from eyas.draft.peagle.model import PEagleConfig, PEagleDraft


READERS = (own, foreign)


def build(path, claims: Claims, target_embedding, where: str, checked: bool = True
          ) -> tuple[PEagleDraft, bool]:
    """(the draft as vLLM serves it with parallel drafting, d2t_missing): as EAGLE-3's
    (eyas.draft.eagle3.formats.build), an eyas draft first held to its own record."""
    tensors = read_tensors(path)
    if checked and claims.format == "eyas":
        eagle3_own.check(claims, tensors, where, weight_shapes=peagle_weight_shapes)
    return assemble(tensors, claims, target_embedding, where,
                    lambda args, embedding, vocab: PEagleDraft(PEagleConfig(**args), embedding,
                                                               vocab))
