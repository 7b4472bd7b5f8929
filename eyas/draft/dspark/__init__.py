"""The DSpark draft family (draft.family=dspark): DFlash's block denoised in one non-causal
pass, every slot drafting (the anchor's too), with a low-rank Markov logit bias on the previous
token and a confidence head, as vLLM 0.32's V2 runner serves it (method "dspark", a GPU).

  model.py       the draft (vLLM's Qwen3DSparkForCausalLM; DFlash's model subclassed)
  checkpoint.py  the writer: vLLM's config and names (eyas.conventions.vllm_dspark) + eyas's keys
  formats.py     the reader of eyas's own DSpark drafts, for eyas.draft.load
  family.py      what the stages get (eyas.draft.families.Family)
"""
