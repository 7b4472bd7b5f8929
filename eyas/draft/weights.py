"""A draft's tensors from any of the layouts people ship, under eyas's (= vLLM's) names.

Files: `model.safetensors` or a sharded `model.safetensors.index.json`. A pickle
(`pytorch_model.bin`, `*.pt`, `*.pth`) is refused, naming the file: unpickling runs whatever
code the file names, so eyas never unpickles a file it is handed (not even with torch's
`weights_only`); whoever trusts the file converts it to safetensors.
Names: vLLM's loader maps `midlayer.` and `layers.0.` to one module and prefixes everything but
`lm_head` with `model.` (model_executor/models/llama_eagle3.py, `hf_to_vllm_mapper`), so a
checkpoint may use any of those spellings; eyas's model uses `midlayer.*` without a prefix.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from eyas.draft.claims import Claims, FormatError
from eyas.draft.spec import DraftModel
from eyas.draft.vocab import DraftVocab, VocabError
from eyas.conventions.vllm_checkpoint import DRAFT_WEIGHTS_FILE
from eyas.layout import LayoutError

INDEX_FILE = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
EMBED = "embed_tokens.weight"


class PickledWeights(LayoutError):
    """A draft whose weights are a pickle: refused, never unpickled."""


def _refuse_pickle(path: Path) -> None:
    pickles = sorted(p for p in path.iterdir() if p.is_file() and (
        p.suffix in PICKLE_SUFFIXES or p.name == f"{BIN_FILE}.index.json"))
    if pickles:
        file = pickles[0]
        raise PickledWeights(
            f"{file}: a pickle, and eyas never unpickles a file it is handed (loading one runs "
            f"whatever code it names); eyas reads a draft's weights from safetensors only "
            f"({DRAFT_WEIGHTS_FILE}, or shards listed in {INDEX_FILE}). If you trust the file, "
            f"convert it: python -c \"import torch; from safetensors.torch import save_file; "
            f"save_file(torch.load('{file}', weights_only=True), "
            f"'{path / DRAFT_WEIGHTS_FILE}')\"")


def weight_files(path) -> list[Path]:
    path = Path(path)
    if (path / DRAFT_WEIGHTS_FILE).is_file():
        return [path / DRAFT_WEIGHTS_FILE]
    if (path / INDEX_FILE).is_file():
        shards = json.loads((path / INDEX_FILE).read_text())["weight_map"].values()
        return [path / s for s in dict.fromkeys(shards)]
    if path.is_dir():
        _refuse_pickle(path)
    raise FileNotFoundError(f"{path}: no draft weights ({DRAFT_WEIGHTS_FILE} or {INDEX_FILE}); "
                            "a draft directory holds config.json and its weights")


def canonical(name: str) -> str:
    """`model.layers.0.self_attn.q_proj.weight` -> `midlayer.self_attn.q_proj.weight`."""
    name = name.removeprefix("model.")
    if name.startswith("layers.0."):
        return "midlayer." + name.removeprefix("layers.0.")
    return name


def read_tensors(path) -> dict[str, torch.Tensor]:
    """The tensors under the names the files hold."""
    from safetensors.torch import load_file

    tensors = {}
    for file in weight_files(path):
        tensors.update(load_file(str(file)))
    return tensors


def load_tensors(path) -> dict[str, torch.Tensor]:
    """The tensors under eyas's names (`canonical`)."""
    return {canonical(k): v for k, v in read_tensors(path).items()}


def header(file) -> dict[str, tuple[int, ...]]:
    """A safetensors file's tensor names and shapes from its header alone: the first 8 bytes
    give the header's length, the JSON after them the tensors; nothing else is read or mapped
    (a 37 GB draft's names cost a few kilobytes)."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100_000_000:
            raise LayoutError(f"{file}: not a safetensors file (header length {size})")
        try:
            entries = json.loads(f.read(size))
        except ValueError as e:
            raise LayoutError(f"{file}: not a safetensors file ({e})") from None
    return {k: tuple(v["shape"]) for k, v in entries.items() if k != "__metadata__"}


def tensor_names(path) -> list[str]:
    """The names the files hold, from their headers alone (`header`)."""
    return [name for file in weight_files(path) for name in header(file)]


def tensor_shapes(path) -> dict[str, tuple[int, ...]]:
    """Names (eyas's spelling) and shapes from the files' headers alone, for config checks."""
    return {canonical(k): v for file in weight_files(path) for k, v in header(file).items()}


def served_vocab(tensors: dict, draft_vocab_size: int, vocab_size: int, where: str
                 ) -> tuple[DraftVocab, bool]:
    """(the vocabulary map vLLM serves, d2t_missing), taking `d2t`/`t2d` out of `tensors`.

    vLLM reads only d2t (target id = draft id + d2t[draft id]) and ignores t2d, so t2d is
    rebuilt from d2t. A full-vocabulary head needs no map (the identity); a reduced head
    without d2t keeps vLLM's zero-initialised d2t: draft id i served as target token i.
    """
    d2t, t2d = tensors.pop("d2t", None), tensors.pop("t2d", None)
    missing = d2t is None and draft_vocab_size < vocab_size
    if d2t is None:
        d2t = torch.zeros(draft_vocab_size, dtype=torch.int64)
    d2t = d2t.to(torch.int64).reshape(-1)
    if d2t.numel() != draft_vocab_size:
        raise VocabError(f"{where}: d2t has {d2t.numel()} entries, lm_head {draft_vocab_size} "
                         "rows; one offset per draft id is expected")
    target_ids = torch.arange(draft_vocab_size) + d2t
    if int(target_ids.min()) < 0 or int(target_ids.max()) >= vocab_size:
        raise VocabError(f"{where}: d2t maps draft ids outside the target vocab 0..{vocab_size - 1}"
                         "; d2t must hold offsets (target id = draft id + d2t[draft id])")
    rebuilt = torch.zeros(vocab_size, dtype=torch.bool)
    rebuilt[target_ids] = True
    del t2d  # ignored by vLLM: what it serves is d2t's map
    return DraftVocab(d2t, rebuilt), missing


def assemble(tensors: dict, claims: Claims, target_embedding, where: str, make,
             rename=canonical) -> tuple[DraftModel, bool]:
    """`build`'s draft from the tensors under the files' names: `make(model args, target
    embedding, served vocab)` builds the family's model, which the tensors, under
    `rename(file name)` (EAGLE-3's: `canonical`), then fill."""
    tensors = {rename(k): v for k, v in tensors.items()}
    args = claims.model_args
    vocab, missing = served_vocab(tensors, args["draft_vocab_size"], args["vocab_size"], where)
    weight = getattr(target_embedding, "weight", target_embedding)
    its_own = tensors.pop(EMBED, None)
    if its_own is not None and not torch.equal(its_own.to(weight.dtype).cpu(),
                                               weight.detach().cpu()):
        raise FormatError(f"{where}: its embed_tokens.weight differs from the target's; vLLM "
                          "would serve the draft's own, and eyas's model reads the target's. "
                          "Check that --target is the model the draft was trained for")
    draft = make(args, target_embedding, vocab).to(tensors["fc.weight"].dtype)
    missing_keys, unexpected = draft.load_state_dict(tensors, strict=False)
    left = [k for k in missing_keys if k not in (EMBED, "d2t", "t2d")]
    if left or unexpected:
        raise FormatError(f"{where}: weights do not fill eyas's model (missing {left}, "
                          f"unexpected {unexpected})")
    return draft.eval(), missing
