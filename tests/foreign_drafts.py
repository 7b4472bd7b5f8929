"""Foreign drafts for the tests: an eyas draft rewritten by another tool's schema (each
converter names the upstream files the schema was read from), a draft trained on block slots
only (what SpecForge and SGLang can express), and an MLA draft (DeepSeek/Kimi) written as vLLM
reads it."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from eyas.store.reader import ExtractedDataset
from helpers import extract_tiny
from world import WORLD_PROBE, train_world_draft, world_settings

# -- foreign drafts: an eyas draft rewritten by another tool's schema ------------------------
# Each converter keeps the trained weights and writes the config and tensor names as that tool
# does (the upstream files the schema was read from are named in each docstring), so the
# doctor, serve and export meet exactly what a user of that tool brings.
def _eyas_parts(src: Path) -> tuple[dict, dict]:
    import json

    from safetensors.torch import load_file
    return json.loads((Path(src) / "config.json").read_text()), load_file(
        str(Path(src) / "model.safetensors"))


def _write(out: Path, config: dict, tensors: dict) -> Path:
    import json

    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


_EYAS_ONLY = ("eyas_layout", "eyas_extra", "eagle_aux_hidden_state_layer_ids", "eagle_config",
              "num_aux_hidden_states")


def as_eagle3(src: Path, out: Path, top=None, nested=None, drop=()) -> Path:
    """A LlamaForCausalLMEagle3 config as EAGLE/vLLM users write it (vLLM 0.32
    model_executor/models/llama_eagle3.py reads it): ids top-level (`top`), under eagle_config
    (`nested`), both or neither; no eyas keys. `drop`: tensors left out (e.g. d2t, t2d)."""
    config, tensors = _eyas_parts(src)
    config = {k: v for k, v in config.items() if k not in _EYAS_ONLY}
    if top is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(top)
    if nested is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(nested),
                                  "use_aux_hidden_state": True}
    return _write(out, config, {k: v for k, v in tensors.items() if k not in drop})


def as_specforge(src: Path, out: Path, ids, extra=None) -> Path:
    """SpecForge's export (sgl-project/SpecForge configs/llama3-8B-eagle3.json for the config
    keys, export/to_sglang.py for the weights: midlayer.*, no embeddings, d2t/t2d kept): a
    plain LlamaConfig with ids, in SGLang's convention, only under eagle_config."""
    config, tensors = _eyas_parts(src)
    keep = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "rms_norm_eps", "max_position_embeddings", "vocab_size",
            "draft_vocab_size", "hidden_act", "rope_theta")
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "num_hidden_layers": 1, "torch_dtype": "float32", "tie_word_embeddings": False,
              **{k: config[k] for k in keep if k in config},
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids),
                               "use_aux_hidden_state": True}, **(extra or {})}
    return _write(out, config, tensors)


def as_speculators(src: Path, out: Path, ids, target_embedding, verifier: str = "tiny-target",
                   full_vocab: bool = False, extra=None) -> Path:
    """vllm-project/speculators' saved eagle3 draft (src/speculators/config.py,
    src/speculators/models/eagle3/config.py and core.py): no model_type, speculators_config,
    transformer_layer_config, top-level ids in vLLM's convention, weights layers.0.*, a frozen
    embed_tokens copy of the verifier's; d2t/t2d only for a reduced vocabulary. `full_vocab`:
    the head widened to the whole target vocabulary (rows outside the trained vocabulary are
    zero), saved without d2t/t2d as speculators does."""
    config, tensors = _eyas_parts(src)
    layer = {"model_type": "llama", "num_hidden_layers": 1, **{k: config[k] for k in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "rms_norm_eps", "max_position_embeddings",
        "rope_parameters", "hidden_act")}}
    d2t = tensors.pop("d2t")
    tensors.pop("t2d")
    if full_vocab:
        head = torch.zeros(config["vocab_size"], config["hidden_size"],
                           dtype=tensors["lm_head.weight"].dtype)
        head[torch.arange(d2t.numel()) + d2t] = tensors["lm_head.weight"]
        tensors["lm_head.weight"] = head
    else:
        t2d = torch.zeros(config["vocab_size"], dtype=torch.bool)
        t2d[torch.arange(d2t.numel()) + d2t] = True
        tensors.update(d2t=d2t, t2d=t2d)
    draft_vocab = tensors["lm_head.weight"].shape[0]
    named = {("layers.0." + k.removeprefix("midlayer.")) if k.startswith("midlayer.") else k: v
             for k, v in tensors.items()}
    named["embed_tokens.weight"] = torch.as_tensor(target_embedding).detach().clone()
    spec = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
            "speculators_version": "0.3.0", "draft_vocab_size": draft_vocab,
            "eagle_aux_hidden_state_layer_ids": list(ids), "embed_requires_grad": False,
            # the options the eyas draft was trained with (speculators writes all four)
            **{k: bool(config.get(k, False)) for k in ("norm_before_fc", "norm_before_residual",
                                                       "norm_output", "fc_norm")},
            "target_hidden_size": None, "tie_word_embeddings": False,
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": verifier}},
            "transformer_layer_config": layer, **(extra or {})}
    return _write(out, spec, named)


BLOCK_SLOTS = ["block_out:1", "block_out:2", "block_out:4"]  # vLLM [2, 3, 5]; SGLang [1, 2, 4]


def build_block_world(w, base: Path) -> SimpleNamespace:
    """The trained world's target extracted again on block slots only (what SpecForge and
    SGLang can express: no embedding) and a draft trained on them by eyas's trainer."""
    extract_tiny(w.target, w.base / "prepare", base / "extract", slots=BLOCK_SLOTS,
                 probe_samples=WORLD_PROBE)
    draft, report = train_world_draft(w, base / "train", str(base / "extract"))
    return SimpleNamespace(data=base / "extract", layout=ExtractedDataset(base / "extract").layout,
                           draft=draft, draft_dir=Path(report.draft_dir))


WORLD_MLA = {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
             "v_head_dim": 8}


def train_mla_draft(w, base: Path) -> SimpleNamespace:
    """A draft with multi-head latent attention trained on the trained world's layout (what a
    DeepSeek/Kimi draft is) by eyas's training loop at the world's settings, its draft built
    with MLA attention. eyas trains and writes Llama drafts only, so the loop stops at its last
    step, before writing one; `as_mla` writes it as vLLM reads such drafts."""
    import eyas.train.loop as loop
    from eyas.draft.eagle3.model import Eagle3Draft
    from eyas.train.data import steps_per_epoch

    config = dataclasses.replace(w.draft_config, mla=dict(WORLD_MLA),
                                 head_dim=WORLD_MLA["qk_rope_head_dim"], num_key_value_heads=
                                 w.draft_config.num_attention_heads)
    build, built = loop.build_draft, []

    def build_mla(data, target_dir, settings):
        _, head, vocab = build(data, target_dir, settings)
        built.append(Eagle3Draft(config, w.embed, vocab))
        return built[-1], head, vocab

    train, settings = world_settings()
    total = train.epochs * steps_per_epoch(len(w.train_samples), train.batch_size)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "build_draft", build_mla)
        loop.train_draft(str(w.data), str(w.target), str(base / "mla"), train, settings,
                         stop_after=total)
    draft = built[-1].eval()
    return SimpleNamespace(draft=draft, config=config, tensors={
        k: v.detach().clone() for k, v in draft.state_dict().items() if k != "embed_tokens.weight"})


def as_mla(mla, out: Path, ids=None, extra=None) -> Path:
    """vLLM's MLA draft (model_executor/models/deepseek_eagle3.py, Eagle3DeepseekV3ForCausalLM:
    DeepSeek's config keys and rope_scaling, midlayer.* weights with q_a_proj,
    kv_a_proj_with_mqa, kv_b_proj; d2t/t2d), ids in both places as vLLM users write them."""
    c = mla.config
    config = {"architectures": ["Eagle3DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
              "num_hidden_layers": 1, "hidden_size": c.hidden_size,
              "num_attention_heads": c.num_attention_heads,
              "num_key_value_heads": c.num_attention_heads,
              "intermediate_size": c.intermediate_size, "rms_norm_eps": c.rms_norm_eps,
              "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
              "draft_vocab_size": c.draft_vocab_size, "hidden_act": "silu",
              "rope_theta": c.rope_parameters["rope_theta"], "torch_dtype": "float32",
              **c.mla, "norm_before_residual": c.norm_before_residual,
              "norm_output": c.norm_output, "fc_norm": c.fc_norm, **(extra or {})}
    if ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(ids)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids),
                                  "use_aux_hidden_state": True}
    return _write(out, config, dict(mla.tensors))
