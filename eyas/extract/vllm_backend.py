"""The vLLM extraction backend, behind the same interface as `TargetBlocks`: a forward that
takes a batch and the slots wanted and returns {slot: [B, T, H]}.

For large targets on GPU clusters: vLLM runs the target tensor/pipeline parallel over the
replica's GPUs (`extract.gpus_per_replica`) and its `extract_hidden_states` method hands the
residual stream out (eyas/engines/vllm_capture.py). vLLM captures only the residual stream, so
`final_norm` (probe sets store it) is computed here from the last block's output with the
target's own final norm, exactly as the model applies it.
"""
from __future__ import annotations

import torch

from eyas.extract.blocks import Batch
from eyas.layout import FINAL_NORM, Slot


class VllmStage:
    first = last = True

    def __init__(self, target_dir: str, num_layers: int, gpus: int = 0,
                 max_model_len: int = 4096):
        from eyas.engines.vllm_engine import EngineOptions

        self.target_dir, self.num_layers = str(target_dir), num_layers
        extra = {"tensor_parallel_size": gpus} if gpus > 1 else {}
        self.options = EngineOptions(max_model_len=max_model_len, extra=extra)
        self.engine, self.ids, self.norm = None, None, None

    def _engine(self, slots: list[Slot]):
        """One booted engine per set of capture ids (shards ask for the layout's slots, the
        probe set for every layer, so at most two boots)."""
        from eyas.conventions import vllm as vllm_convention
        from eyas.layout import TargetIdentity
        from eyas.engines.vllm_capture import VllmCapture
        from eyas.targets import read_shape

        target: TargetIdentity = read_shape(self.target_dir)
        ids = vllm_convention.to_capture_ids(slots, target)
        if ids != self.ids:
            self.close()
            self.engine = VllmCapture(self.target_dir, ids, self.options)
            self.ids = ids
        return self.engine

    @torch.no_grad()
    def forward(self, batch: Batch, hidden, slots):
        if not slots:  # vLLM's capture method cannot run capturing nothing: no bare forward
            return None, None
        stream = [s for s in slots if s != FINAL_NORM]
        if FINAL_NORM in slots and Slot("block_out", self.num_layers - 1) not in stream:
            stream.append(Slot("block_out", self.num_layers - 1))
        prompts = [batch.input_ids[i, :n].tolist() for i, n in enumerate(batch.lengths)]
        captured = self._engine(stream).capture(prompts)
        b, t = batch.input_ids.shape
        out = {}
        for slot in stream:
            h = captured[0][slot.name].shape[-1]
            padded = torch.zeros(b, t, h, dtype=captured[0][slot.name].dtype)  # [B, T, H]
            for i, n in enumerate(batch.lengths):
                padded[i, :n] = captured[i][slot.name]
            out[slot] = padded
        if FINAL_NORM in slots:
            out[FINAL_NORM] = self._final_norm()(out[Slot("block_out", self.num_layers - 1)])
        return None, out

    def _final_norm(self):
        if self.norm is None:
            from eyas.targets.parts import target_parts
            self.norm = target_parts(self.target_dir)[1].norm
        return self.norm

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
