"""The EAGLE-3 family's draft formats: one reader per format people have, and how a draft read
by any of them is built (`build`, called by eyas.draft.load.load).

  speculators  vllm-project/speculators: speculators_config, transformer_layer_config
  own          eyas's own: LlamaForCausalLMEagle3 plus eyas_layout and eyas_model_args
               (eyas.draft.checkpoint writes it)
  specforge    SpecForge's export: ids only under eagle_config, SGLang's convention
  mla          vLLM's Eagle3DeepseekV2/V3ForCausalLM: the layer around multi-head latent
               attention (DeepSeek/Kimi drafts)
  eagle3       vLLM's/SGLang's LlamaForCausalLMEagle3 (EAGLE's): ids top-level and/or under
               eagle_config, or none

Each reads the config once, through what vLLM reads of it
(eyas.conventions.vllm_checkpoint.read_draft_config), into `Claims`: the model's constructor
arguments (Eagle3Config's fields), what vLLM reads, and the slots the config says the draft was
trained on (None when it does not say: never guessed). eyas.conventions.feeds says what each
engine feeds the draft; eyas.draft.fixed writes a corrected config beside the weights.
Full-vocabulary drafts (no d2t/t2d) load in every format.
"""
from __future__ import annotations

from eyas.draft.claims import Claims
from eyas.draft.eagle3.formats import eagle3, mla, own, specforge, speculators
from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
from eyas.draft.weights import assemble, read_tensors

READERS = (speculators, own, specforge, mla, eagle3)  # the first that matches reads the config


def build(path, claims: Claims, target_embedding, where: str, checked: bool = True
          ) -> tuple[Eagle3Draft, bool]:
    """(the draft as vLLM would serve it, as eyas's model; d2t_missing). vLLM reads d2t only
    (t2d is ignored) and without d2t takes draft id i for target id i, so a t2d that disagrees
    is rebuilt from d2t and a missing d2t is the identity, flagged. Its own embedding is
    refused when it differs from the target's (eyas's model reads the target's). `checked`:
    an eyas draft is first held to its own record (formats.own.check)."""
    tensors = read_tensors(path)
    if checked and claims.format == "eyas":
        own.check(claims, tensors, where)
    return assemble(tensors, claims, target_embedding, where,
                    lambda args, embedding, vocab: Eagle3Draft(Eagle3Config(**args), embedding,
                                                               vocab))
