"""vLLM's default aux ids on a small target: (2, N//2, N-3) collapses for N = 4
(docs/engines.md, "Default ids").

Builds a 4-layer Llama and a 3-slot EAGLE-3 draft, deletes the aux ids from the draft's
config (top level and eagle_config), boots vLLM straight through eyas's `boot_llm` (eyas's
own check_draft_config would refuse this draft), prints the layers vLLM's target model was
set to capture, and runs one greedy request: the first decode step cannot reshape two
captured states into fc's 3 x H input.

    python docs/scripts/vllm_default_ids.py
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import _tiny


def aux_layers(llm) -> list:
    """The capture list vLLM set on the target model (in-process engine: one worker)."""
    return llm.collective_rpc(
        lambda worker: tuple(worker.model_runner.get_model().model.aux_hidden_state_layers))


def main() -> None:
    from vllm import SamplingParams

    from eyas.conventions import vllm as vllm_convention
    from eyas.engines.vllm_engine import EngineOptions, boot_llm

    with tempfile.TemporaryDirectory() as tmp:
        target = _tiny.llama(Path(tmp) / "target", layers=4)
        draft = _tiny.draft(target, ["embed", "block_out:1", "block_out:3"], Path(tmp) / "draft")
        config_file = draft / "config.json"
        config = json.loads(config_file.read_text())
        config.pop(vllm_convention.AUX_IDS_KEY)
        config["eagle_config"].pop(vllm_convention.AUX_IDS_KEY)
        config_file.write_text(json.dumps(config))
        print(_tiny.versions())
        print(f"draft config: num_aux_hidden_states={config['num_aux_hidden_states']}, no ids")
        llm = boot_llm(target, EngineOptions(), speculative_config={
            "method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})
        print(f"vLLM's default for N=4: {vllm_convention.default_ids(4)}; capture set on the "
              f"target: {aux_layers(llm)[0]}")
        try:
            outs = llm.generate([{"prompt_token_ids": p} for p in _tiny.prompts(target)],
                                SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                                use_tqdm=False)
            print(f"generated without error: {[o.outputs[0].token_ids for o in outs]}")
        except Exception as e:  # noqa: BLE001  (the failure is the measurement)
            cause = e
            while cause.__cause__ is not None:
                cause = cause.__cause__
            print(f"generate failed: {type(cause).__name__}: {cause}")


if __name__ == "__main__":
    main()
