"""Readers for the EAGLE-3 draft formats people have, one module per format:

  eagle3       vLLM's/SGLang's LlamaForCausalLMEagle3 (EAGLE's, eyas's): ids top-level and/or
               under eagle_config, or none
  specforge    SpecForge's export: ids only under eagle_config, SGLang's convention
  speculators  vllm-project/speculators: speculators_config, transformer_layer_config
  mla          vLLM's Eagle3DeepseekV2/V3ForCausalLM: the layer around multi-head latent
               attention (DeepSeek/Kimi drafts)

Each returns `Claims`: eyas's hyper-parameters, the keys vLLM reads, and the slots the config
says the draft was trained on (None when it does not say: never guessed). `load` builds the
draft as eyas's `Eagle3Draft` around the target's embedding, with the vocabulary vLLM serves;
`feed.feed` says what each engine will feed it; `write_fixed` writes a corrected config next
to the untouched weights. Full-vocabulary drafts (no d2t/t2d) load in every format.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from eyas.draft.formats import eagle3, mla, specforge, speculators
from eyas.draft.formats.common import Claims, FormatError
from eyas.draft.formats.feed import ids_to_write
from eyas.draft.formats.weights import (
    EMBED,
    canonical,
    load_tensors,
    served_vocab,
    tensor_shapes,
    weight_files,
)
from eyas.draft.model import Eagle3Config, Eagle3Draft
from eyas.engines import vllm_checkpoint
from eyas.files import read_model_config
from eyas.layout import HiddenStateLayout, TargetIdentity

READERS = (speculators, specforge, mla, eagle3)  # the first that matches reads the config
__all__ = ["Claims", "FormatError", "LoadedDraft", "load", "read_claims", "write_fixed"]


def read_claims(path, target: TargetIdentity) -> Claims:
    """What the draft directory's config and weight names say, for `target` (a foreign
    config does not name the target's depth, so its ids are read against this one)."""
    weight_files(path)  # a directory without weights is named as such first
    config = read_model_config(path, "draft")
    source = f"draft {Path(path) / 'config.json'}"
    for reader in READERS:
        if reader.matches(config):
            return reader.read(config, tensor_shapes(path), target, source)
    raise FormatError(
        f"{source}: architectures {config.get('architectures')} with no speculators_config: "
        "not an EAGLE-3 draft format eyas reads (LlamaForCausalLMEagle3 / "
        "Eagle3LlamaForCausalLM configs, SpecForge exports, speculators eagle3, "
        "Eagle3DeepseekV2/V3ForCausalLM MLA drafts)")


@dataclass
class LoadedDraft:
    draft: Eagle3Draft
    claims: Claims
    d2t_missing: bool  # a reduced vocabulary without d2t: served as draft id i = target id i


def load(path, target_embedding, target: TargetIdentity) -> LoadedDraft:
    """The draft as vLLM would serve it, as eyas's model (its own embedding is refused
    when it differs from the target's: eyas's model reads the target's)."""
    claims = read_claims(path, target)
    where = f"draft {path}"
    tensors = load_tensors(path)
    hyper = claims.hyper
    vocab, missing = served_vocab(tensors, hyper["draft_vocab_size"], hyper["vocab_size"], where)
    weight = getattr(target_embedding, "weight", target_embedding)
    own = tensors.pop(EMBED, None)
    if own is not None and not torch.equal(own.to(weight.dtype).cpu(), weight.detach().cpu()):
        raise FormatError(f"{where}: its embed_tokens.weight differs from the target's; vLLM "
                          "would serve the draft's own, and eyas's model reads the target's. "
                          "Check that --target is the model the draft was trained for")
    draft = Eagle3Draft(Eagle3Config(**hyper), target_embedding, vocab)
    draft = draft.to(tensors["fc.weight"].dtype)
    missing_keys, unexpected = draft.load_state_dict(tensors, strict=False)
    left = [k for k in missing_keys if k not in ("embed_tokens.weight", "d2t", "t2d")]
    if left or unexpected:
        raise FormatError(f"{where}: weights do not fill eyas's model (missing {left}, "
                          f"unexpected {unexpected})")
    return LoadedDraft(draft.eval(), claims, missing)


def fixed_config(claims: Claims, layout: HiddenStateLayout, engine: str, version: str | None,
                 dtype: str, source: str = "", original: dict | None = None) -> dict:
    """A LlamaForCausalLMEagle3 config that makes `engine` feed `layout` (eyas's own format,
    with the layout by name: eyas's stages then read it as an eyas draft). An MLA draft keeps
    its own config (architecture, ranks), the ids set; it records no eyas_layout (eyas's own
    format is the Llama draft's), so it is read back by its ids."""
    keys, _ = ids_to_write(layout, engine, version)
    if claims.hyper.get("mla"):
        config = {**(original or {}), **keys}
        config["eyas_fixed_from"] = {"format": claims.format, "said": claims.says,
                                     "source": source}
        return config
    config = vllm_checkpoint.draft_config(claims.hyper, layout, dtype)
    if engine != "vllm":
        config.pop("eagle_aux_hidden_state_layer_ids", None)
        from eyas.engines import sglang
        config["eyas_engine"] = {"engine": engine, "version": version or sglang.VERIFIED}
    config.update(keys)
    config[eagle3.LAYOUT_KEY] = layout.to_dict()
    config["eyas_fixed_from"] = {"format": claims.format, "said": claims.says,
                                 "source": source}
    return config


def write_fixed(path, out_dir, claims: Claims, layout: HiddenStateLayout, engine: str,
                version: str | None = None, record_layout: bool = True) -> Path:
    """OUT/config.json corrected for `engine`, beside the draft's weights copied unchanged
    (SGLang skips unknown names silently, so for it names other than midlayer.* are
    rewritten; the values stay as they are). `record_layout`: also write `layout` as the
    slots the draft was trained on (eyas_layout)."""
    path, out = Path(path), Path(out_dir)
    if out.resolve() == path.resolve():
        raise FormatError(f"--write-fixed {out}: the draft's own directory; name a new one so "
                          "the original stays untouched")
    dtype = str(load_tensors(path)["fc.weight"].dtype).removeprefix("torch.")
    config = fixed_config(claims, layout, engine, version, dtype, str(path),
                          read_model_config(path, "draft"))
    if not record_layout:
        config.pop(eagle3.LAYOUT_KEY, None)
    out.mkdir(parents=True, exist_ok=True)
    files = weight_files(path)
    renamed = engine != "vllm" and any(canonical(k) != k for k in _raw_names(files))
    if renamed:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in load_tensors(path).items()},
                  str(out / vllm_checkpoint.DRAFT_WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        for file in files + [p for p in path.glob("*.index.json")]:
            shutil.copy2(file, out / file.name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def _raw_names(files) -> list[str]:
    from safetensors import safe_open
    names = []
    for file in files:
        if file.suffix == ".bin":
            names += list(torch.load(file, map_location="cpu", weights_only=True))
        else:
            with safe_open(str(file), "pt") as f:
                names += list(f.keys())
    return names


