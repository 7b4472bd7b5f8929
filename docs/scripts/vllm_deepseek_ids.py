"""How vLLM's DeepSeek-V3 model treats aux ids: written order vs concat order, and id 0
(docs/engines.md, "DeepSeek family").

Builds a tiny random DeepSeek-V3 (MLA + MoE, sized for the CPU MLA kernel) and captures
states with vLLM's `extract_hidden_states`, booted through eyas's `boot_llm` with the CPU
connector of eyas.engines.vllm_capture, but with raw ids (eyas itself refuses both cases):
  1. ids (3, 1): prints the capture list vLLM keeps and which HF hidden_states index each
     column of the captured tensor matches (layer order or written order?);
  2. ids (0, 2): the embedding id; prints the error.

    python docs/scripts/vllm_deepseek_ids.py [--json OUT]

`--json` writes the record (bench/record.py) that docs/engines.md's table is generated from.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import _tiny


def boot_capture(target: Path, ids: list[int], storage: Path):
    from eyas.conventions import vllm as vllm_convention
    from eyas.engines import vllm_capture
    from eyas.engines.vllm_engine import EngineOptions, boot_llm

    return boot_llm(
        target, EngineOptions(), enable_prefix_caching=False,
        speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                            "draft_model_config": {"hf_config": {vllm_convention.AUX_IDS_KEY: ids}}},
        kv_transfer_config={"kv_connector": vllm_capture.CONNECTOR,
                            "kv_connector_module_path": vllm_capture.__name__,
                            "kv_role": "kv_producer",
                            "kv_connector_extra_config": {"shared_storage_path": str(storage)}})


def capture(llm, prompt: list[int]):
    from safetensors.torch import load_file
    from vllm import SamplingParams

    from eyas.engines.vllm_capture import _drain

    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=1),
                       use_tqdm=False)[0]
    path = out.kv_transfer_params["hidden_states_path"]
    _drain(llm, [path], in_process=True)
    return load_file(path)["hidden_states"]  # [T, n_ids, H]


def root_cause(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


def main() -> None:
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv[1:-1] else None
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        target = _tiny.deepseek_v3(Path(tmp) / "target", layers=4)
        prompt = _tiny.prompts(target, 1)[0]
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        with torch.no_grad():
            reported = model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
        print(_tiny.versions())
        print(f"DeepSeek-V3, 4 layers, MLA kv_lora_rank 512 + rope 64; "
              f"prompt of {len(prompt)} tokens")

        llm = boot_capture(target, [3, 1], Path(tmp) / "a")
        kept = llm.collective_rpc(
            lambda w: tuple(w.model_runner.get_model().model.aux_hidden_state_layers))[0]
        print(f"ids written (3, 1): capture list vLLM keeps {kept}")
        states = capture(llm, prompt)
        record = {"written": "(3, 1)", "kept": str(kept), "columns": [],
                  "prompt_tokens": len(prompt)}
        for j in range(states.shape[1]):
            diffs = {k: (states[:, j] - reported[k][0]).abs().max().item() for k in range(4)}
            best = min(diffs, key=diffs.get)
            print(f"  column {j}: closest HF hidden_states[{best}] (max |diff| {diffs[best]:.1e}; "
                  f"others >= {min(v for k, v in diffs.items() if k != best):.1e})")
            record["columns"].append({"column": j, "closest": best, "max_diff": diffs[best],
                                      "others_min": min(v for k, v in diffs.items()
                                                        if k != best)})
        llm.llm_engine.engine_core.shutdown()
        del llm

        llm = boot_capture(target, [0, 2], Path(tmp) / "b")
        try:
            states = capture(llm, prompt)
            record["embed_id"] = f"captured {tuple(states.shape)} without error"
        except Exception as e:  # noqa: BLE001  (the failure is the measurement)
            record["embed_id"] = f"capture failed: {root_cause(e)}"
        print(f"ids (0, 2): {record['embed_id']}")
    if out:
        made = _tiny.records()
        made.write(out, record, made.provenance(sys.argv[1:], prompts=[prompt]),
              {"DeepSeek-V3": {"layers": 4, "dtype": "float32"}}, shared=())


if __name__ == "__main__":
    main()
