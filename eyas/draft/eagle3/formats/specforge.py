"""SpecForge's exported draft: SGLang's `LlamaForCausalLMEagle3` config with the ids ONLY
under `eagle_config` (never top-level), in SGLang's convention: id k = the OUTPUT of decoder
layer k (SGLang's Llama capture adds 1; -1 would be the embedding).

Schema read in sgl-project/SpecForge: configs/*.json (e.g. configs/deepseek-v3-671b-eagle3.json
`eagle_config.eagle_aux_hidden_state_layer_ids` [1, 29, 57]), export/to_sglang.py (weights
`midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`; embeddings dropped), and
specforge/modeling/draft/llama3_eagle.py (`norm_output` there means "norm before lm_head",
default true; the recurrent state is always pre-norm).

vLLM reads the same eagle_config list as inputs of layers, so it feeds every slot one layer
earlier than SpecForge trained it (vLLM issue 43671). Any config shaped like this one (ids only
under eagle_config, no eyas keys: eyas's own are read first, by formats.own) is read here; the
doctor's evidence table tests the other reading in its shifted rows.
"""
from __future__ import annotations

import eyas.draft.eagle3.formats.eagle3 as eagle3
from eyas.draft.claims import Claims, FormatError, layout_from_stream, model_args_from
from eyas.conventions.vllm import AUX_IDS_KEY
from eyas.conventions.vllm_checkpoint import read_draft_config
from eyas.layout import TargetIdentity


def matches(config: dict) -> bool:
    view = read_draft_config(config)
    return eagle3.matches(config) and view.top_ids is None and view.nested_ids is not None


def read(config: dict, shapes: dict, target: TargetIdentity, source: str) -> Claims:
    if config.get("norm_output"):
        raise FormatError(
            f"{source}: norm_output is true. In SpecForge it means 'norm before lm_head' (its "
            "default), but vLLM reads it as 'feed the post-norm state to the next step', which "
            "SpecForge never trained; remove the key to serve it as SpecForge trained it")
    view, notes = read_draft_config(config), []
    args = model_args_from(config, view, shapes, target, source)
    ids = view.nested_ids
    if len(set(ids)) != args["num_aux_hidden_states"]:
        notes.append(f"eagle_config names {len(set(ids))} ids but fc takes "
                     f"{args['num_aux_hidden_states']}: what the draft was trained on is unknown")
        layout = None
    else:
        layout = layout_from_stream([k + 1 for k in ids], target, source,
                                    "SGLang/SpecForge ids (output of layer k)")
    if any(k < -1 for k in ids):
        raise FormatError(f"{source}: eagle_config ids {ids}: -1 (the embedding) is the lowest "
                          "SGLang id")
    return Claims("specforge", args, view, layout,
                  f"eagle_config.{AUX_IDS_KEY} {ids} (SGLang's/SpecForge's "
                  "convention: id k = output of layer k)", "d2t" in shapes, notes)
