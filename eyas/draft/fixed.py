"""A draft's config rewritten so an engine feeds it the slots it was trained on (`eyas doctor
--write-fixed`, and the serve stage's and `eyas export`'s copies for vLLM): the ids the engine
reads (eyas.conventions.engines.ids_to_write), in eyas's own format, beside the draft's weights
copied unchanged. Any family whose config vLLM reads as EAGLE-3's (EAGLE-3, EAGLE 3.1, P-EAGLE,
an MLA draft)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from eyas.conventions import vllm_checkpoint
from eyas.conventions.engines import engine_rules, ids_to_write
from eyas.draft.claims import Claims, FormatError
from eyas.draft.directory import CONFIG_FILE, LAYOUT_KEY, read_config, stamp
from eyas.draft.weights import canonical, load_tensors, tensor_names, weight_files
from eyas.layout import HiddenStateLayout


def fixed_config(claims: Claims, layout: HiddenStateLayout, engine: str, version: str | None,
                 dtype: str, source: str = "", original: dict | None = None) -> dict:
    """A LlamaForCausalLMEagle3 config that makes `engine` feed `layout` (eyas's own format,
    with the layout by name: eyas's stages then read it as an eyas draft). An MLA draft keeps
    its own config (architecture, ranks), the ids set; it records no eyas_layout (eyas's own
    format is the Llama draft's), so it is read back by its ids."""
    keys, _ = ids_to_write(layout, engine, version)
    if claims.model_args.get("mla"):
        config = {**(original or {}), **keys}
        config["eyas_fixed_from"] = {"format": claims.format, "said": claims.says,
                                     "source": source}
        return config
    if "mask_token_id" in claims.model_args:  # P-EAGLE (eyas.draft.peagle): its layers, mask id
        from eyas.conventions.kinds import FAMILY_KEY
        config = vllm_checkpoint.peagle_draft_config(claims.model_args, layout, dtype)
        config[FAMILY_KEY] = "peagle"
    else:
        config = vllm_checkpoint.draft_config(claims.model_args, layout, dtype)
    if not engine_rules(engine).reads_top_level_ids:  # SGLang: its ids, for its version
        from eyas.conventions import sglang
        config = sglang.stamp_export(config, version)
    config.update(keys)
    stamp(config)[LAYOUT_KEY] = layout.to_dict()
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
                          read_config(path))
    if not record_layout:
        config.pop(LAYOUT_KEY, None)
    from eyas.conventions.rules import read_ids  # right under each of its runners

    reads = {tuple(read_ids(r, config).capture or ()) for r in engine_rules(engine).runners}
    if len(reads) > 1:
        raise FormatError(f"--write-fixed {out}: the config written would be read differently "
                          f"by {engine}'s runners ({sorted(reads)}); a bug in eyas")
    out.mkdir(parents=True, exist_ok=True)
    files = weight_files(path)
    renamed = (engine_rules(engine).skips_unknown_weights
               and any(canonical(k) != k for k in tensor_names(path)))
    if renamed:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in load_tensors(path).items()},
                  str(out / vllm_checkpoint.DRAFT_WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        for file in files + [p for p in path.glob("*.index.json")]:
            shutil.copy2(file, out / file.name)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
