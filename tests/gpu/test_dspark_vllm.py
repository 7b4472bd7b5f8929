"""On a GPU machine with vLLM's CUDA build: a DSpark draft trained by eyas, served by vLLM's V2
runner (method "dspark", k = block_size: every block slot drafts, the Markov bias added left
to right with the token just sampled). Skipped where no CUDA device or no CUDA vLLM is present
(vLLM's CPU build runs the V1 runner, which has no DSpark: the pipeline refuses that run before
any stage, tests/unit/test_dspark_run.py).

Two engines on the device (the target alone, and with the draft), bfloat16: the greedy outputs
must agree but at near-ties of the target's own logits (eyas.serve.lossless, as the serve
stage judges them), vLLM must count K drafted tokens per verify step, and accept about as
many of them as eyas's reference engine does with the same draft (the same proposals up to
the two engines' numerics).
"""
from types import SimpleNamespace

import pytest
import torch

from helpers import vllm_installed

pytestmark = [pytest.mark.gpu, pytest.mark.vllm,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

BLOCK = 4
K = BLOCK  # num_speculative_tokens: the anchor's slot drafts too
MAX_NEW = 24
SLOTS = ["block_out:0", "block_out:2", "final_prenorm"]  # target_layer_ids [0, 2, 3]
DTYPE = "bfloat16"


def _cuda_vllm():
    if not vllm_installed():
        pytest.skip("vllm is not installed")
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        pytest.skip("vLLM's CPU build: no V2 runner, no DSpark")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    _cuda_vllm()
    from eyas.config import DraftConfig, TrainConfig
    from eyas.engines.vllm_engine import EngineOptions, VllmEngine, generate
    from eyas.targets import load_tokenizer
    from eyas.train.loop import train_draft
    from helpers import conversations, extract_tiny, make_tiny_target, prepare_tiny

    base = tmp_path_factory.mktemp("dspark")
    target = make_tiny_target(base / "target", "llama", layers=4, hidden=256)  # head size 64
    prepare_tiny(base / "prepare", load_tokenizer(target), n_train=32, n_heldout=4)
    extract_tiny(target, base / "prepare", base / "extract", slots=SLOTS)
    train = TrainConfig(num_workers=1, epochs=6, batch_size=4, lr=3e-3, checkpoint_every=10**6,
                        seed=0)
    report = train_draft(str(base / "extract"), str(target), str(base / "train"), train,
                         DraftConfig(family="dspark", block_size=BLOCK, vocab_size=160))
    tok = load_tokenizer(target)
    texts = [tok.apply_chat_template(c[:1], tokenize=False, add_generation_prompt=True)
             for c in conversations(4, seed=9)]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    options = EngineOptions(dtype=DTYPE, memory_share=0.4)
    baseline = generate(target, None, 0, prompts, MAX_NEW + K, options)
    with VllmEngine(target, report.draft_dir, K, options) as engine:
        served = engine.generate(prompts, MAX_NEW)
    return dict(target=target, draft_dir=report.draft_dir, prompts=prompts, served=served,
                baseline=baseline, data=base / "extract")


def test_the_serve_preflight_admits_it_on_the_gpus_runner(world):
    from eyas.serve.run import preflight

    checked = preflight(world["target"], world["draft_dir"], world["data"], "vllm", K,
                        weigh=False)
    assert checked["findings"] == []


def test_served_dspark_drafts_k_tokens_a_step_and_is_lossless(world):
    from eyas.serve.lossless import judge, partings

    served, baseline = world["served"], world["baseline"]
    acc = served.acceptance
    assert acc is not None and acc.drafts > 0 and acc.draft_tokens == K * acc.drafts
    assert len(acc.accepted_per_position) == K and sum(acc.accepted_per_position) == acc.accepted
    assert 0 < acc.accepted < acc.draft_tokens, acc  # both paths of the verifier exercised
    plain = SimpleNamespace(prompts=world["prompts"],
                            outputs=[o[:MAX_NEW] for o in baseline.outputs])
    spec = SimpleNamespace(prompts=world["prompts"], outputs=served.outputs)
    judged = judge(world["target"], partings(plain, spec), DTYPE)
    assert all(j["near_tie"] for j in judged), judged


def test_vllm_accepts_what_eyas_reference_engine_accepts(world):
    """eyas's reference engine drafts with the same sequential Markov chain (the previous
    slot's own token past the context); on the same prompts its acceptance length is
    vLLM's, up to bfloat16 against float32 (a misaligned Markov token or a dropped anchor
    slot would part them by far more)."""
    from transformers import AutoModelForCausalLM

    from eyas.draft.load import load
    from eyas.engines.reference import generate_speculative
    from eyas.targets.parts import target_parts

    loaded = load(world["draft_dir"], target_parts(world["target"])[0])
    target = AutoModelForCausalLM.from_pretrained(str(world["target"])).eval()
    accepted = drafts = 0
    for prompt in world["prompts"]:
        _, stats = generate_speculative(target, loaded.draft, loaded.layout, prompt, K, MAX_NEW)
        accepted, drafts = accepted + stats.accepted, drafts + stats.drafts
    ours = 1 + accepted / drafts
    theirs = world["served"].acceptance.tau
    assert abs(ours - theirs) <= 0.15 * ours, (ours, theirs)
