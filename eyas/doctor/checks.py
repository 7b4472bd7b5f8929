"""The doctor's checks that need no model run: identities, chat templates, the vocabulary map
and the verifier slot of a draft and its data (`static_findings`), and what is wrong with the
tensors an engine feeds it (`fed_slots_finding`). The serve stage runs them before an engine
boots, and parity (eyas/serve/parity.py) judges fed tensors with the same words."""
from __future__ import annotations

from eyas.doctor.candidates import engine_ids, relation, slots_in_words
from eyas.doctor.findings import Finding
from eyas.draft.vocab import DraftVocab
from eyas.layout import FINAL_NORM, HiddenStateLayout, TargetIdentity


def static_findings(draft_layout: HiddenStateLayout, data_layout: HiddenStateLayout,
                    vocab: DraftVocab, target: TargetIdentity | None = None,
                    prepared_chat_template: str = "", d2t_missing: bool = False
                    ) -> list[Finding]:
    """Checks that need no model: identities, templates, vocabulary map, verifier slot."""
    out = []

    def differ(a: TargetIdentity, b: TargetIdentity) -> list[str]:
        return [m for m in a.mismatches(b) if not m.startswith("chat_template")]
    pairs = [("the draft", draft_layout.target, "the data", data_layout.target)]
    if target is not None:
        pairs.append(("the target at hand", target, "the data", data_layout.target))
    for who, a, whom, b in pairs:
        if differ(a, b):
            out.append(Finding("target_mismatch", (
                f"{who} is for target {a.fingerprint} and {whom} came from target "
                f"{b.fingerprint} ({'; '.join(differ(a, b))}); a draft is only evaluated "
                "and served with its own target: re-extract or retrain for one of them")))
    templates = {"prepare": prepared_chat_template, "extraction": data_layout.target.chat_template,
                 "the draft": draft_layout.target.chat_template,
                 "the target's tokenizer now": target.chat_template if target else ""}
    known = {k: v for k, v in templates.items() if v}
    if len(set(known.values())) > 1:
        out.append(Finding("chat_template_changed", (
            "the chat template changed between prepare and evaluation ("
            + ", ".join(f"{k}: {v}" for k, v in known.items()) + "): prompts are rendered "
            "differently from the training data, so the draft sees text it was not trained on; "
            "re-run prepare (and the later stages) with the current template, or restore it")))
    ids_note = ("vLLM will map draft ids to the wrong target tokens (draft id i served as "
                "target token i): re-save the draft with the d2t built from its training "
                "data (eyas.draft.vocab.build_vocab)")
    if d2t_missing:
        out.append(Finding("d2t_missing", f"the checkpoint has no d2t tensor: {ids_note}"))
    elif vocab.size < vocab.target_vocab_size and not bool(vocab.d2t.any()):
        out.append(Finding("d2t_identity", (
            f"d2t is all zeros (the identity) although the draft vocab ({vocab.size}) is smaller "
            f"than the target's ({vocab.target_vocab_size}): {ids_note}")))
    if FINAL_NORM in (draft_layout.verifier, data_layout.verifier):
        out.append(Finding("postnorm_verifier", postnorm_message(draft_layout)))
    return out


def postnorm_message(layout: HiddenStateLayout) -> str:
    """Why a draft trained against the state after the final norm is wrong, and the fix."""
    last = f"block_out:{layout.target.num_layers - 1}"
    return ("the draft was trained against the target's state AFTER the final norm "
            "(final_norm; the trainer's target head applies the norm again), not the last block "
            f"output before it ({last}): its targets were not the target's tokens. Extract with "
            "extract.layout.verifier=final_prenorm and retrain")


def fed_slots_finding(trained: HiddenStateLayout, fed: HiddenStateLayout | None,
                      nearest: list[str], worst: float = 0.0, tolerance: float | None = None,
                      numerics: str = "") -> Finding | None:
    """What is wrong with the tensors something (an engine) feeds the draft, or None.

    `fed`: the layout those tensors matched (None: two of them match one stored slot;
    `nearest` then lists each one's nearest stored slot); `worst`: the largest relative
    error of a fed tensor against the stored slot it matched, held to `tolerance` when one
    is given (see fingerprints.parity_tolerance; `numerics` says which dtypes set it)."""
    if fed is None:
        return Finding("other_slots", (
            f"the fed tensors match no consistent layout (nearest stored slots {nearest}): the "
            f"engine feeds a slot twice; the draft was trained on {slots_in_words(trained.draft_inputs)}"))
    kind = relation(trained, fed)
    if kind != "same":
        return Finding(kind, (
            f"the engine feeds {slots_in_words(fed.draft_inputs)}; the draft was trained on "
            f"{slots_in_words(trained.draft_inputs)}; compile the layout for this engine with "
            f"{engine_ids(trained)} and write them in the draft config "
            "(eyas.draft.checkpoint.save_draft writes both places vLLM reads)"))
    if tolerance is not None and worst > tolerance:  # the right slots: no id list fixes this
        return Finding("values_differ", (
            f"the engine feeds the slots the draft was trained on "
            f"({slots_in_words(trained.draft_inputs)}), but their values differ from the stored "
            f"ones by up to {worst:.1e} mean per-token relative error (tolerance "
            f"{tolerance:.1e} for {numerics}): the engine "
            "runs another revision of the target, or other numerics, than the extraction did; "
            "serve the target the data was extracted from, in the extraction's dtype"))
    return None
