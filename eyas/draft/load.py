"""The one loader of a draft directory, whatever wrote it: eyas's own format is one reader among
the others, and every caller (evaluate, serve, the doctor, training's tests, the benches) gets
the same `LoadedDraft`.

A registered family's `formats` module (eyas.draft.eagle3.formats: EAGLE-3's) gives `READERS`,
modules with `matches(config)` and `read(config, shapes, target, source) -> Claims`, and
`build(path, claims, target_embedding, where, checked)` -> (model, d2t_missing); optionally
`tensor_shapes(path)`, the weights' names and shapes as its readers spell them (default:
EAGLE-3's canonical names). The first reader that matches the config reads it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from eyas.draft.directory import CONFIG_FILE, LAYOUT_KEY, check_draft_format, read_config
from eyas.draft.families import DEFAULT, REGISTRY
from eyas.draft.claims import Claims, FormatError
from eyas.draft.weights import tensor_shapes, weight_files
from eyas.conventions.kinds import draft_kind
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity

# each family's readers once, the latest registered first (eyas.draft.families)
FORMATS = tuple(dict.fromkeys(f.formats for f in reversed(REGISTRY.values())))


def speculative_config(draft_config: dict) -> dict:
    """vLLM's speculative_config entries (beyond model and k) for a draft directory's config:
    those of the family it reads as (`draft_kind`: a P-EAGLE draft of another trainer is
    served with parallel drafting; a kind eyas does not register, as EAGLE-3)."""
    family = REGISTRY.get(draft_kind(draft_config).base, REGISTRY[DEFAULT])
    return dict(family.speculative)


@dataclass
class LoadedDraft:
    draft: nn.Module  # the family's model (an eyas.draft.eagle3.model.Eagle3Draft), in eval mode
    layout: HiddenStateLayout | None  # the slots it was trained on; None (examined): unknown
    claims: Claims  # what its config says, and how (its format, the model's arguments)
    d2t_missing: bool  # a reduced vocabulary without d2t: served as draft id i = target id i


def _read(path, target: TargetIdentity):
    weight_files(path)  # a directory without weights is named as such first
    config = read_config(path)
    source = f"draft {Path(path) / CONFIG_FILE}"
    try:
        check_draft_format(config, source)
    except ValueError as e:
        raise FormatError(str(e)) from None
    for family in FORMATS:
        for reader in family.READERS:
            if reader.matches(config):
                shapes = getattr(family, "tensor_shapes", tensor_shapes)(path)
                return family, reader.read(config, shapes, target, source)
    kind = draft_kind(config)
    if kind.parallel_drafting:  # e.g. SpecForge's PEagleDraftModel, which method eagle3 renames
        raise FormatError(  # to Eagle3PEagleDraftModel, a name vLLM's registry does not hold
            f"{source}: a P-EAGLE draft (architectures {config.get('architectures')}) that "
            "neither eyas nor vLLM reads (vLLM's method eagle3 renames it Eagle3"
            f"{(config.get('architectures') or ['?'])[0]}, which its registry does not "
            "hold): vLLM serves P-EAGLE as architectures "
            "[\"LlamaForCausalLMEagle3\"] with its mask token id as mask_token_id and a "
            "mask_hidden tensor, under method eagle3 with parallel_drafting")
    if not kind.readable:
        raise FormatError(
            f"{source}: a {kind.name} draft (architectures {config.get('architectures')}): "
            f"eyas cannot yet train or score {kind.name} drafts"
            + (" of other trainers (it reads the drafts it writes: eyas_family and "
               "eyas_layout in config.json)" if kind.name in REGISTRY else "")
            + f"; `eyas doctor draft={Path(path)} target=TARGET static=true` says which "
            "target layers each engine and runner will feed it")
    raise FormatError(
        f"{source}: architectures {config.get('architectures')} with no speculators_config: "
        "not an EAGLE-3 draft format eyas reads (LlamaForCausalLMEagle3 / "
        "Eagle3LlamaForCausalLM configs, EAGLE's LlamaForCausalLM template, SpecForge exports, "
        "speculators eagle3, Eagle3DeepseekV2/V3ForCausalLM MLA drafts)")


def read_claims(path, target: TargetIdentity) -> Claims:
    """What the draft directory's config and weight names say, for `target` (a foreign
    config does not name the target's depth, so its ids are read against this one)."""
    return _read(path, target)[1]


def load(path, target_embedding, target: TargetIdentity | None = None, *,
         expected_layout: HiddenStateLayout | None = None, examine: bool = False
         ) -> LoadedDraft:
    """The draft in `path` as its engine would serve it, around the target's embedding
    [vocab, hidden] (weights.served_vocab: a missing d2t is the identity, flagged; a t2d that
    disagrees with d2t is rebuilt from it, as vLLM reads d2t only).

    `target`: the target's identity, against which a draft of another format is read (its
    config does not name the target's depth); without it only eyas's own format loads.
    Refused: an eyas draft that contradicts its own record (formats.own.check), a draft whose
    config does not say which slots it was trained on, and, with `expected_layout` (e.g. the
    evaluation data's), a draft trained on other slots or another target, naming both sides.
    `examine` (the doctor, serve's preflight): none of the first two refusals; what the config
    says and leaves unknown is in `claims` and `layout`, for the caller to judge.
    """
    where = f"draft {path}"
    if target is None:
        config = read_config(path)
        if LAYOUT_KEY not in config:
            raise LayoutError(f"{where}: config.json has no {LAYOUT_KEY!r}, so which target "
                              "tensors its fc expects is unknown without the target (vLLM ids "
                              "alone are ambiguous); refusing to guess")
        target = HiddenStateLayout.from_dict(config[LAYOUT_KEY], source=where).target
    family, claims = _read(path, target)
    if claims.layout is None and not examine:
        raise LayoutError(
            f"{where}: its config ({claims.format} format) does not say which target tensors "
            f"it was trained on ({claims.says}); run eyas doctor draft={path} "
            "data=RUN_DIR/extract engine=vllm write_fixed=DIR to establish them, then use DIR")
    if expected_layout is not None and claims.layout is not None:
        expected_layout.check_matches(claims.layout, "the caller", where)
    draft, d2t_missing = family.build(path, claims, target_embedding, where,
                                      checked=not examine)
    return LoadedDraft(draft, claims.layout, claims, d2t_missing)
