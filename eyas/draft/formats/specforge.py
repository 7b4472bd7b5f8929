"""SpecForge's exported draft: SGLang's `LlamaForCausalLMEagle3` config with the ids ONLY
under `eagle_config` (never top-level), in SGLang's convention: id k = the OUTPUT of decoder
layer k (SGLang's Llama capture adds 1; -1 would be the embedding).

Schema read in sgl-project/SpecForge: configs/*.json (e.g. configs/deepseek-v3-671b-eagle3.json
`eagle_config.eagle_aux_hidden_state_layer_ids` [1, 29, 57]), export/to_sglang.py (weights
`midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`; embeddings dropped), and
specforge/modeling/draft/llama3_eagle.py (`norm_output` there means "norm before lm_head",
default true; the recurrent state is always pre-norm).

vLLM reads the same eagle_config list as inputs of layers (one layer earlier): the case of
vLLM issue 43671. Any config shaped like this one (ids only under eagle_config, no eyas keys)
is read here; the evidence table's shifted rows test the other reading.
"""
from __future__ import annotations

from eyas.draft.formats import eagle3
from eyas.draft.formats.common import (
    Claims,
    FormatError,
    hyper_from,
    layout_from_stream,
)
from eyas.engines.vllm_checkpoint import read_norm_options
from eyas.layout import TargetIdentity


def matches(config: dict) -> bool:
    v = eagle3.view(config)
    return (eagle3.matches(config) and eagle3.LAYOUT_KEY not in config
            and v.top_ids is None and v.nested_ids is not None)


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    if config.get("norm_output"):
        raise FormatError(
            f"{source}: norm_output is true. In SpecForge it means 'norm before lm_head' (its "
            "default), but vLLM reads it as 'feed the post-norm state to the next step', which "
            "SpecForge never trained; remove the key to serve it as SpecForge trained it")
    hyper = hyper_from(config, shapes, target, source, read_norm_options(config))
    v, notes = eagle3.view(config), []
    ids = v.nested_ids
    if len(set(ids)) != hyper["num_aux_hidden_states"]:
        notes.append(f"eagle_config names {len(set(ids))} ids but fc takes "
                     f"{hyper['num_aux_hidden_states']}: what the draft was trained on is unknown")
        layout = None
    else:
        layout = layout_from_stream([k + 1 for k in ids], target, source,
                                    "SGLang/SpecForge ids (output of layer k)")
    if any(k < -1 for k in ids):
        raise FormatError(f"{source}: eagle_config ids {ids}: -1 (the embedding) is the lowest "
                          "SGLang id")
    return Claims("specforge", hyper, v, layout,
                  f"eagle_config.eagle_aux_hidden_state_layer_ids {ids} (SGLang's/SpecForge's "
                  "convention: id k = output of layer k)", "d2t" in shapes, notes)
