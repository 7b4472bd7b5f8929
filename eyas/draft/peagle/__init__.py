"""P-EAGLE (eyas.draft.families `peagle`): EAGLE-3's draft drafting a step's tokens in one
causal pass (model.py), written and read as vLLM serves it (checkpoint.py, formats.py)."""
