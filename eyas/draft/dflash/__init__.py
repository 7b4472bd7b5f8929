"""The DFlash draft family (draft.family=dflash): a block of mask tokens denoised in one
non-causal pass over the target's context features, as vLLM 0.32 serves it (method "dflash").

  model.py       the draft (vLLM's DFlashQwen3ForCausalLM) and its per-position outputs
  checkpoint.py  the writer: vLLM's config and names (eyas.conventions.vllm_dflash) + eyas's keys
  formats.py     the reader of eyas's own DFlash drafts, for eyas.draft.load
  family.py      what the stages get (eyas.draft.families.Family)
"""
