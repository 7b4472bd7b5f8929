"""Before vLLM boots with a draft: the ids it will feed the draft, refused where vLLM would
read the draft's config otherwise than the draft was trained (eyas.conventions.vllm_checkpoint
reads the config as vLLM does; this checks it against the target at hand and the draft's
own layout)."""
from __future__ import annotations

from eyas.conventions import vllm as vllm_convention
from eyas.conventions import vllm_checkpoint, vllm_dflash
from eyas.files import read_model_config
from eyas.layout import HiddenStateLayout, LayoutError
from eyas.targets import text_config


def check_draft_for_target(target_dir, draft_dir,
                           expected_layout: HiddenStateLayout | None = None) -> list[int]:
    """The ids vLLM will feed the draft (stream positions: for a DFlash draft its
    target_layer_ids after vLLM's shift). Raises LayoutError where vLLM would mis-read the
    draft config, where the ids don't compile from the layout saved in the draft (eyas
    drafts carry one), or where that layout is for another target or differs from
    `expected_layout` (e.g. the extracted data's)."""
    from eyas.draft.directory import LAYOUT_KEY
    from eyas.conventions.kinds import draft_kind

    config = read_model_config(target_dir, "target")
    arch = next(iter(config.get("architectures") or []), "")
    config = text_config(config)
    draft, where = read_model_config(draft_dir, "draft"), f"draft {draft_dir}"
    n = int(config["num_hidden_layers"])
    dflash = draft_kind(draft).block
    if dflash:  # its ids through the engine rule of dflash_config (conventions/vllm_dflash)
        vllm_convention.family(arch)  # a target vLLM can capture from at all
        ids = vllm_dflash.read_capture(draft, n, where)
        for key, want in (("target_hidden_size", config.get("hidden_size")),
                          ("vocab_size", config.get("vocab_size"))):
            if want is not None and draft.get(key) not in (None, want):
                raise LayoutError(f"{where}: {key} {draft.get(key)} but the target's is {want}")
    else:
        ids = vllm_checkpoint.check_draft_config(
            draft, n, target_architecture=arch, target_hidden_size=config.get("hidden_size"),
            target_vocab_size=config.get("vocab_size"), source=where)
    if LAYOUT_KEY not in draft:
        if expected_layout is not None:
            raise LayoutError(f"{where} carries no {LAYOUT_KEY}; cannot check it against "
                              f"{expected_layout.describe()}")
        return ids
    layout = HiddenStateLayout.from_dict(draft[LAYOUT_KEY], source=where)
    if vllm_convention.to_ids(layout) != ids:
        if dflash:
            written = vllm_dflash.written(ids)
            raise LayoutError(
                f"{where}: vLLM reads {vllm_dflash.IDS_PATH} {written} as outputs of layers "
                f"(stream {ids}) and will feed {vllm_dflash.slots_fed(ids, n)}, but the "
                f"draft was trained on {layout.names}, which DFlash writes as "
                f"{vllm_dflash.to_layer_ids(layout)} (stream {vllm_convention.to_ids(layout)})"
                + (": the ids were written as stream indices (input of layer k, EAGLE-3's "
                   "convention), one too high" if written == vllm_convention.to_ids(layout)
                   else ""))
        raise LayoutError(f"{where}: vLLM will feed ids {ids}, but the draft was trained on "
                          f"{layout.names} = ids {vllm_convention.to_ids(layout)}")
    trained_for, here = layout.target, (arch, int(config["num_hidden_layers"]),
                                        int(config["hidden_size"]))
    if (trained_for.architecture, trained_for.num_layers, trained_for.hidden_size) != here:
        raise LayoutError(f"{where} was trained for {trained_for.architecture} with "
                          f"{trained_for.num_layers} blocks of {trained_for.hidden_size}; the "
                          f"target {target_dir} is {here[0]} with {here[1]} of {here[2]}")
    if trained_for.weights:  # fingerprinted at extraction: the very same target revision
        from eyas.targets import identify

        mismatches = [m for m in trained_for.mismatches(identify(target_dir))
                      if m.split(":")[0] in ("weights", "tokenizer")]
        if mismatches:
            raise LayoutError(f"{where} was trained on another revision of {target_dir}: "
                              + "; ".join(mismatches))
    if expected_layout is not None:
        expected_layout.check_matches(layout, "the expected layout", where)
    return ids
