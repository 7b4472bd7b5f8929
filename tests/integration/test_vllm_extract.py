"""The vLLM extraction backend writes the same tensors as the HF backend, every layer too."""
import pytest
import torch

from eyas.config import ExtractConfig
from eyas.extract import Extraction, extract_dataset, in_process_executor
from eyas.store.reader import ExtractedDataset
from eyas.layout import HiddenStateLayout
from eyas.targets import identify, load_tokenizer
from helpers import SLOTS, extract_tiny, make_tiny_target, prepare_tiny, vllm_installed

pytestmark = [pytest.mark.integration, pytest.mark.vllm,
              pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed")]


def test_vllm_backend_matches_hf_backend(tmp_path):
    from eyas.extract.vllm_backend import VllmStage

    target = make_tiny_target(tmp_path / "target", "llama", layers=4, hidden=256)  # CPU attention needs head_dim 64
    tokenizer = load_tokenizer(target)
    prepare_tiny(tmp_path / "prepare", tokenizer, n_train=8, n_heldout=2)
    extract_tiny(target, tmp_path / "prepare", tmp_path / "hf", probe_samples=2)
    identity = identify(target, tokenizer)
    layout = HiddenStateLayout.from_names(identity, SLOTS)
    cfg = ExtractConfig(backend="vllm", dtype="float32", samples_per_shard=8,
                        batch_tokens=512, probe_samples=2)
    stage = VllmStage(str(target), identity.num_layers, max_model_len=512)
    try:
        forward = stage.forward
        executor = in_process_executor(lambda b, s: forward(b, None, s)[1], layout,
                                       tmp_path / "vllm", cfg, tokenizer.pad_token_id)
        manifest = extract_dataset(Extraction(tmp_path / "prepare", tmp_path / "vllm", layout,
                                              tokenizer, cfg),
                                   executor, lambda b, s: forward(b, None, s)[1])
    finally:
        stage.close()
    assert manifest["bare_forward_tokens_per_s"] is None  # vLLM has no capture-free forward
    for split in ("train", "heldout", "probe"):
        hf, vl = ExtractedDataset(tmp_path / "hf", split), ExtractedDataset(tmp_path / "vllm", split)
        assert len(hf) == len(vl) > 0
        for i in range(len(hf)):
            a, b = hf[i], vl[i]
            assert a.sample_id == b.sample_id and set(a.slots) == set(b.slots)
            for name in a.slots:
                torch.testing.assert_close(b.slots[name], a.slots[name], rtol=1e-4, atol=1e-4,
                                           msg=f"{split} {a.sample_id} {name}")
