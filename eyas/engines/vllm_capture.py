"""The hidden states vLLM really computes, captured with its `extract_hidden_states` method.

    states = capture_hidden_states(target_dir, layout, prompts)
    states[r]["block_out:1"]   # Tensor [len(prompts[r]), hidden] for request r

vLLM runs the target over each prompt, and a KV connector writes the requested residual-stream
states ([T, n_ids, H], ids ascending) to one safetensors file per request. Compared with the HF
tensors the extractor trained on, this proves (or refutes) train/serve parity at the source.

vLLM's stock `ExampleHiddenStatesConnector` copies out of the KV cache through pinned memory on
a CUDA stream; on CPU that dies when a request finishes (`pin_memory=True requires a CUDA or
other accelerator backend`). `CpuHiddenStatesConnector` (built on first attribute access, so
this module imports without vLLM) does the same copy in ordinary memory and writes the file
synchronously. vLLM loads it by name from this module (`kv_connector_module_path`).
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

from eyas.conventions import vllm as vllm_convention
from eyas.layout import HiddenStateLayout, Slot, TargetIdentity
from eyas.engines.vllm_engine import EngineOptions, _same_threads_here, boot_llm, import_vllm
from eyas.targets import read_shape

CONNECTOR = "CpuHiddenStatesConnector"
_built: dict[str, type] = {}


def _connector_class() -> type:
    """A subclass of vLLM's example connector whose save works without an accelerator."""
    if CONNECTOR in _built:
        return _built[CONNECTOR]
    import_vllm()
    import torch
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as ex

    class _Done:  # stands in for the CUDA event the base class polls
        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

    class CpuHiddenStatesConnector(ex.ExampleHiddenStatesConnector):
        def _submit_async_write(self, pending) -> None:
            if not self._is_tp_rank_zero:
                return
            # slot of token t = block_ids[t // block_size] * block_size + t % block_size
            block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
            offsets = torch.arange(self._block_size, dtype=torch.long)
            slots = (block_ids[:, None] * self._block_size + offsets[None, :]).flatten()
            num_tokens = pending.token_ids.shape[0]
            states = ex.extract_from_kv_cache(self._kv_cache, slots, num_tokens)  # [T, n_ids, H]
            tensors = {"hidden_states": states.clone(), "token_ids": pending.token_ids.clone()}
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            try:
                save_file(tensors, pending.filename)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)  # releases the reader's wait (LOCK_EX held since arrival)
            self._req_copy_events[pending.req_id] = _Done()

    CpuHiddenStatesConnector.__module__ = __name__
    _built[CONNECTOR] = CpuHiddenStatesConnector
    return CpuHiddenStatesConnector


def __getattr__(name: str):
    if name == CONNECTOR:  # vLLM's connector factory does getattr(module, name)
        return _connector_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _slots(layout_or_ids, target: TargetIdentity) -> tuple[list[Slot], list[int]]:
    """(slots, their capture ids ascending). A layout asks for its draft inputs and verifier;
    a list of vLLM ids (e.g. range(N + 1), every stream) asks for those streams."""
    if isinstance(layout_or_ids, HiddenStateLayout):
        if layout_or_ids.target.num_layers != target.num_layers:
            raise ValueError(f"layout is for a {layout_or_ids.target.num_layers}-block target, "
                             f"{target.architecture} has {target.num_layers}")
        vllm_convention.to_ids(layout_or_ids)  # the draft inputs must be servable by vLLM at all
        slots = list(layout_or_ids.slots)
    else:
        slots = [Slot.at_stream_index(int(i), target.num_layers) for i in layout_or_ids]
    ids = vllm_convention.to_capture_ids(slots, target)
    return slots, ids


def _drain(llm, paths: list[str], in_process: bool, timeout_s: float = 120.0) -> None:
    """Wait until every file is written. The connector writes a request's states one engine
    step AFTER the request finishes, and generate() returns at the finish: in-process nothing
    else steps the engine, so step it here (the scheduler keeps stepping while finished
    requests wait on the connector); a separate engine-core process steps by itself."""
    deadline = time.monotonic() + timeout_s
    while not all(os.path.isfile(p) and not _locked(p) for p in paths):
        if time.monotonic() > deadline:
            missing = [p for p in paths if not os.path.isfile(p)]
            raise RuntimeError(f"vLLM wrote no hidden states to {missing} in {timeout_s:.0f} s")
        if in_process:
            llm.llm_engine.step()
        else:
            time.sleep(0.05)


def _locked(path: str) -> bool:
    """True while the writer holds the companion .lock (LOCK_EX from arrival to written)."""
    lock = path + ".lock"
    if not os.path.exists(lock):
        return False
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


class VllmCapture:
    """A booted vLLM that captures the residual-stream states `layout_or_ids` names; call
    `capture` as often as needed, then `close` (or use `with`)."""

    def __init__(self, target_dir, layout_or_ids, options: EngineOptions = EngineOptions(),
                 out_dir=None):
        import_vllm()
        self.target = read_shape(target_dir)
        self.slots, self.ids = _slots(layout_or_ids, self.target)
        self.options = options
        self._tmp = None if out_dir else tempfile.TemporaryDirectory(prefix="eyas-vllm-capture-")
        self.storage = Path(out_dir or self._tmp.name)
        self.llm = boot_llm(
            target_dir, options, enable_prefix_caching=False,  # every token computed here
            speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                "draft_model_config": {"hf_config": {
                                    vllm_convention.AUX_IDS_KEY: self.ids}}},
            kv_transfer_config={"kv_connector": CONNECTOR, "kv_connector_module_path": __name__,
                                "kv_role": "kv_producer",
                                "kv_connector_extra_config": {
                                    "shared_storage_path": str(self.storage)}})

    def capture(self, prompts: list[list[int]]) -> list[dict]:
        """Per prompt, {slot name: Tensor [T, H]} as vLLM computes them (prefill)."""
        from safetensors.torch import load_file
        from vllm import SamplingParams

        if not prompts or not all(len(p) for p in prompts):
            raise ValueError("prompts must be non-empty token id lists")
        _same_threads_here(self.options)
        outs = self.llm.generate([{"prompt_token_ids": list(map(int, p))} for p in prompts],
                                 SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
        paths = [(o.kv_transfer_params or {}).get("hidden_states_path") for o in outs]
        if not all(paths):
            raise RuntimeError(f"vLLM named no hidden-states file for some requests "
                               f"({[o.kv_transfer_params for o in outs]})")
        _drain(self.llm, paths, self.options.in_process)
        results = []
        column = {i: j for j, i in enumerate(self.ids)}
        for prompt, path in zip(prompts, paths):
            data = load_file(path)
            states, tokens = data["hidden_states"], data["token_ids"]  # [T, n_ids, H], [T]
            if tokens.tolist() != list(map(int, prompt)) or states.shape[1] != len(self.ids):
                raise RuntimeError(f"{path}: {tuple(states.shape)} over {len(tokens)} tokens, "
                                   f"expected {len(self.ids)} ids over the {len(prompt)} "
                                   "prompt tokens")
            results.append({s.name: states[:, column[s.stream_index()], :].clone()
                            for s in self.slots})
            for leftover in (path, path + ".lock"):
                Path(leftover).unlink(missing_ok=True)
        return results

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def capture_hidden_states(target_dir, layout_or_ids, prompts: list[list[int]],
                          options: EngineOptions = EngineOptions(), out_dir=None
                          ) -> list[dict]:
    """Boot, capture, shut down. `layout_or_ids`: a HiddenStateLayout (its draft inputs +
    verifier) or vLLM ids, e.g. [0, 1, 2, 3, 4] on a 4-block target -> embed, block_out:0 ..
    block_out:3. Files go to `out_dir` (default: a temp dir, removed afterwards)."""
    with VllmCapture(target_dir, layout_or_ids, options, out_dir) as engine:
        return engine.capture(prompts)
