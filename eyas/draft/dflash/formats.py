"""The DFlash family's draft formats, for eyas.draft.load (`READERS`, `build`): eyas's own
DFlash drafts (eyas.draft.dflash.checkpoint writes them: `eyas_family` "dflash" with
`eyas_layout` and `eyas_model_args`). Other trainers' DFlash drafts (z-lab's, SpecForge's) are
not read yet: their lm_head and embedding may be the target's, which eyas's model does not
share; the doctor's --static examination says what each engine feeds them.

The config is read as vLLM reads it (eyas.conventions.vllm_dflash): the ids it captures
(dflash_config.target_layer_ids, +1), the hyper-parameters and mask id it builds the model
with; the model is rebuilt from eyas_model_args, which must agree with them.
"""
from __future__ import annotations

from pathlib import Path

from eyas.conventions import vllm, vllm_dflash
from eyas.conventions.vllm_checkpoint import DRAFT_HYPER_KEYS, NORM_OPTIONS, VllmView
from eyas.draft.dflash.model import DFlashConfig, DFlashDraft
from eyas.draft.directory import LAYOUT_KEY, MODEL_ARGS_KEY
from eyas.draft.checkpoint import check_tensors
from eyas.draft.claims import Claims, FormatError
from eyas.draft.weights import assemble
from eyas.draft.weights import EMBED, header, read_tensors, weight_files
from eyas.conventions.kinds import FAMILY_KEY
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity

MASK_EMBEDDING_FILE = "mask_embedding.pt"  # qwen3_dflash.py `_read_mask_embedding`


def _name(name: str) -> str:
    """vLLM's loader prefixes all but lm_head/d2t with `model.`: either spelling reads."""
    return name.removeprefix("model.")


def tensor_shapes(path) -> dict[str, tuple[int, ...]]:
    """Names and shapes from the files' headers (not EAGLE-3's `canonical` names: a DFlash
    draft's layers.0.* is a layer among several, not EAGLE-3's midlayer)."""
    return {_name(k): v for file in weight_files(path) for k, v in header(file).items()}


class Own:
    """eyas's own DFlash format; a family built on DFlash's (DSpark) subclasses it with its
    `family` name and its vLLM `conventions` module (HYPER_KEYS, weight_shapes)."""

    family = "dflash"
    conventions = vllm_dflash

    @classmethod
    def matches(cls, config: dict) -> bool:
        return config.get(FAMILY_KEY) == cls.family and LAYOUT_KEY in config

    @classmethod
    def read(cls, config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
        args = config.get(MODEL_ARGS_KEY)
        if not isinstance(args, dict):
            raise FormatError(f"{source}: an eyas {cls.family} draft without {MODEL_ARGS_KEY}; "
                              "retrain it, or examine it with the doctor's --static")
        said = {k: config.get(k) for k in cls.conventions.HYPER_KEYS}
        said["mask_token_id"] = (config.get("dflash_config") or {}).get("mask_token_id")
        differ = [k for k in said if said[k] != args.get(k)]
        if differ:
            raise FormatError(f"{source}: {MODEL_ARGS_KEY} and the keys vLLM reads differ on "
                              f"{differ}, so eyas would rebuild another draft than vLLM serves; "
                              "was config.json edited by hand?")
        expected = cls.conventions.weight_shapes(args)
        wrong = sorted(k for k in set(shapes) | set(expected) if k != EMBED
                       and tuple(shapes.get(k) or ()) != expected.get(k, ()))
        if wrong:
            raise FormatError(f"{source}: weights differ from the draft its {MODEL_ARGS_KEY} "
                              f"describe: {[(k, shapes.get(k), expected.get(k)) for k in wrong]}")
        layout = HiddenStateLayout.from_dict(config[LAYOUT_KEY], source=source)
        notes = []
        if layout.target.num_layers != target.num_layers:
            notes.append(f"the draft was trained for a {layout.target.num_layers}-block "
                         f"target; this one has {target.num_layers}")
        try:
            stream = vllm_dflash.read_capture(config, target.num_layers, source)
        except LayoutError as e:
            notes.append(str(e))
            stream = None
        return Claims("eyas", dict(args), _view(args, stream, config), layout,
                      f"{LAYOUT_KEY} {layout.names}", "d2t" in shapes, notes)


def _view(args: dict, stream: list[int] | None, config: dict) -> VllmView:
    """What vLLM reads, in the form the EAGLE-3 readers give it: ids captured, fc sized for
    the ids' count, no EAGLE-3 norm options."""
    hyper = {k: args.get(k) for k in DRAFT_HYPER_KEYS}
    hyper["num_aux_hidden_states"] = len(stream) if stream else args["num_aux_hidden_states"]
    return VllmView(None, None, hyper["num_aux_hidden_states"], True,
                    {k: False for k in NORM_OPTIONS}, hyper, stream, config)


READERS = (Own,)


def check(claims: Claims, where: str) -> None:
    """Refuse an eyas DFlash draft whose config does not feed what its layout records."""
    config_stream = claims.view.ids
    if config_stream is None:
        raise LayoutError(f"{where}: " + "; ".join(claims.notes))
    if config_stream != vllm.to_ids(claims.layout):  # the layout's stream positions
        raise LayoutError(
            f"{where}: vLLM will capture stream positions {config_stream} "
            f"({vllm_dflash.IDS_PATH} +1), but the draft was trained on {claims.layout.names}, "
            f"written {vllm_dflash.IDS_PATH} {vllm_dflash.to_layer_ids(claims.layout)}; "
            "was config.json edited by hand?")


def _dflash(args: dict, embedding, vocab) -> DFlashDraft:
    return DFlashDraft(DFlashConfig(**args), embedding, vocab)


def build(path, claims: Claims, target_embedding, where: str, checked: bool = True, *,
          weight_shapes=vllm_dflash.weight_shapes, make=_dflash) -> tuple[DFlashDraft, bool]:
    """(the draft as vLLM would serve it, d2t_missing); `checked`: held to its own record
    first (the ids it feeds compile from its layout; exactly vLLM's tensors: `weight_shapes`
    of its arguments). `make(args, target embedding, vocab)`: the family's model."""
    if (Path(path) / MASK_EMBEDDING_FILE).exists():
        raise FormatError(
            f"{where}: {MASK_EMBEDDING_FILE} beside the weights: vLLM replaces the mask token's "
            "embedding with it, while eyas's DFlash model embeds the masks with the target's "
            f"row {claims.model_args['mask_token_id']}; remove it to serve what eyas scores")
    args = claims.model_args
    tensors = {_name(k): v for k, v in read_tensors(path).items()}
    if checked:
        check(claims, where)
        dtype = tensors["fc.weight"].dtype
        check_tensors({k: v for k, v in tensors.items() if k != EMBED},
                      weight_shapes(args), dtype, where)
    return assemble(tensors, claims, target_embedding, where, make, rename=lambda k: k)
