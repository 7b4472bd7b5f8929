"""Drafts: a family's model, its training objective, the checkpoint it is written as, the
readers of the formats it comes in, and the one loader every stage uses.

Shared by every family:
  spec.py        the types: `Family` (a family eyas trains), `DraftModel` / `ParallelDraft`
                 (the model's interface); `hyper_overrides` (draft.* sizes over the target's)
  families.py    the registry of families: `draft.family`'s choices, `get(name)`
  load.py        `load`: any draft directory -> `LoadedDraft` (the model, the layout it was
                 trained on, what its config claims, d2t_missing); `read_claims`;
                 `speculative_config`
  claims.py      `Claims`, what a draft's config says (read by every family's readers);
                 `FormatError`
  weights.py     the weight files: reading them, names, the served vocabulary; `assemble`,
                 a read draft's model filled from its tensors
  ttt.py         the objective: the training-time test (EAGLE-3's chain unrolled, a
                 `ParallelDraft`'s positions in one pass) and its loss (plus a family's own
                 per-row term, its model's `auxiliary_loss`: DSpark's confidence head)
  labels.py      the ce loss's labels: the target head's, cached per training sample
                 (`TargetLabelCache`, shared over data-parallel ranks while it fills)
  accuracy.py    what it scores: per-position accuracy, predicted τ
  attention.py   the training-time test's attention cache
  checkpoint.py  the writer: eyas's own format, vLLM's keys and eyas's (`save_draft`)
  fixed.py       a draft's config rewritten so an engine feeds it its trained slots
  directory.py   eyas's keys in a draft's config.json (eyas_layout, eyas_model_args,
                 eyas_extra, eyas_family, eyas_format), read_config
  vocab.py       the draft vocabulary (d2t/t2d) the engines load
The EAGLE-3 family, eagle3/:
  model.py (mla.py)  the model: vLLM's LlamaForCausalLMEagle3, or its layer around
                     multi-head latent attention
  formats/           the readers, eyas's own format among them, and `build`
  family.py          its `Family` entries (eagle3, eagle3.1)

Another family (P-EAGLE, DFlash, DSpark) is a folder eyas/draft/<family>/ with its model, objective
(if not the TTT loss), checkpoint writer, a formats module giving `READERS` and `build` as
eyas/draft/eagle3/formats/ does, and a family.py building its `Family`; it plugs in as one
entry of `families.REGISTRY` (and, if its config reads as a new kind, one of
eyas/conventions/kinds.py's `KINDS`).
Its readers turn each config into `Claims` whose `model_args` are its model's constructor
arguments; its writer stores them under eyas_model_args (with eyas_layout), so its own drafts
rebuild from what they carry. tests/unit/test_families.py tests every registered family.
"""
