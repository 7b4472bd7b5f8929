"""The EAGLE-3 draft model and its vLLM checkpoint: names, shapes, maths, config, round trip
through the one loader (eyas.draft.load.load)."""
from __future__ import annotations

import json
from dataclasses import asdict, fields

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from eyas.draft.directory import LAYOUT_KEY, MODEL_ARGS_KEY, read_config

from eyas.draft.checkpoint import save_draft
from eyas.draft.load import load
from eyas.draft.eagle3.model import Eagle3Config
from eyas.draft.vocab import build_vocab
from eyas.conventions import vllm_checkpoint
from eyas.layout import HiddenStateLayout, LayoutError
from helpers import tiny_setup

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def tiny():
    return tiny_setup()


# The tensor list of docs/engines.md ("The draft checkpoint vLLM loads"), with this draft's numbers:
# H=32, heads 4 x head_dim 8, kv heads 2, I=64, 3 slots, draft vocab 64, vocab 96.
VLLM_TENSORS = {
    "fc.weight": (32, 96),
    "midlayer.hidden_norm.weight": (32,),
    "midlayer.input_layernorm.weight": (32,),
    "midlayer.post_attention_layernorm.weight": (32,),
    "midlayer.self_attn.q_proj.weight": (32, 64),
    "midlayer.self_attn.k_proj.weight": (16, 64),
    "midlayer.self_attn.v_proj.weight": (16, 64),
    "midlayer.self_attn.o_proj.weight": (32, 32),
    "midlayer.mlp.gate_proj.weight": (64, 32),
    "midlayer.mlp.up_proj.weight": (64, 32),
    "midlayer.mlp.down_proj.weight": (32, 64),
    "norm.weight": (32,),
    "lm_head.weight": (64, 32),
    "d2t": (64,),
    "t2d": (96,),
}


def test_config_from_target_takes_the_targets_numbers(tiny):
    c = tiny.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.target_hidden_size, c.num_aux_hidden_states) == \
        (32, 4, 2, 8, 64, 32, 3)
    assert c.rope_parameters["rope_theta"] == 5000.0 and c.vocab_size == 96
    assert Eagle3Config.from_target(tiny.cfg, 3, 64, intermediate_size=128).intermediate_size == 128
    with pytest.raises(ValueError, match="hidden_size 64 differs from the target's 32"):
        Eagle3Config.from_target(tiny.cfg, 3, 64, hidden_size=64)
    # every field is written into a draft's config, but `mla`: eyas reads MLA drafts (their
    # keys are vllm_checkpoint.MLA_KEYS) and trains Llama ones
    assert {f.name for f in fields(Eagle3Config)} == set(vllm_checkpoint.DRAFT_HYPER_KEYS) | set(
        vllm_checkpoint.NORM_OPTIONS) | {"mla"}


def test_weight_names_and_shapes_are_vllms(tiny):
    state = {k: tuple(v.shape) for k, v in tiny.draft.state_dict().items()}
    assert state.pop("embed_tokens.weight") == (96, 32)
    assert state == VLLM_TENSORS
    assert vllm_checkpoint.draft_weight_shapes(vars(tiny.config)) == VLLM_TENSORS
    trainable = {n for n, p in tiny.draft.named_parameters() if p.requires_grad}
    assert "embed_tokens.weight" not in trainable and "fc.weight" in trainable
    assert tiny.draft.embed_tokens.weight.data_ptr() == tiny.embed.weight.data_ptr()  # shared


def test_forward_shapes_and_width_checks(tiny):
    ids, hidden = tiny.ids[:2], tiny.hidden[:2]
    prenorm, logits = tiny.draft(ids, hidden)
    assert prenorm.shape == (2, 24, 32) and logits.shape == (2, 24, 64)
    again, _ = tiny.draft(ids, tiny.draft.fc(hidden), projected=True)
    torch.testing.assert_close(again, prenorm, rtol=0, atol=0)
    with pytest.raises(ValueError, match="width 32, expected 96"):
        tiny.draft(ids, hidden[..., :32])


def _rms(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _with_options(tiny, **options):
    """The tiny draft rebuilt with norm options on, its norm weights random (so a norm
    applied in the wrong place, or not at all, changes the numbers)."""
    from dataclasses import replace

    from eyas.draft.eagle3.model import Eagle3Draft
    torch.manual_seed(1)
    d = Eagle3Draft(replace(tiny.config, **options), tiny.embed, tiny.vocab)
    d.load_state_dict(tiny.draft.state_dict(), strict=False)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight") or ".weight" in name and "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    return d


OPTION_CASES = [{}, {"norm_before_fc": True}, {"fc_norm": True},
                {"norm_before_residual": True}, {"norm_output": True},
                {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True}]


@pytest.mark.parametrize("options", OPTION_CASES, ids=lambda o: "+".join(o) or "none")
def test_forward_is_vllms_llama_eagle3_maths(tiny, options):
    """Recompute from the raw tensors what vLLM's llama_eagle3 computes (embeds first;
    residual = fc out, or hidden_norm(fc out) with norm_before_residual; input_norm then the
    per-slot fc_norm before fc; the post-norm state fed back with norm_output)."""
    d = _with_options(tiny, **options) if options else tiny.draft
    w, eps = d.state_dict(), tiny.config.rms_norm_eps
    ids, hidden = tiny.ids[:1, :10], tiny.hidden[:1, :10]
    if options.get("norm_before_fc"):
        hidden = _rms(hidden, w["input_norm.weight"], eps)
    if options.get("fc_norm"):
        hidden = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"], eps)
                            for i, c in enumerate(hidden.chunk(3, dim=-1))], dim=-1)
    h = hidden @ w["fc.weight"].T  # [1, 10, 32]
    normed_h = _rms(h, w["midlayer.hidden_norm.weight"], eps)
    x = torch.cat([_rms(tiny.embed.weight[ids], w["midlayer.input_layernorm.weight"], eps),
                   normed_h], dim=-1)  # [1, 10, 64]
    if options.get("norm_before_residual"):
        h = normed_h
    a = "midlayer.self_attn."
    q = (x @ w[a + "q_proj.weight"].T).view(1, 10, 4, 8).transpose(1, 2)
    k = (x @ w[a + "k_proj.weight"].T).view(1, 10, 2, 8).transpose(1, 2)
    v = (x @ w[a + "v_proj.weight"].T).view(1, 10, 2, 8).transpose(1, 2)
    inv = 1.0 / 5000.0 ** (torch.arange(0, 8, 2).float() / 8)
    ang = torch.arange(10).float()[:, None] * inv
    emb = torch.cat([ang, ang], -1)[None]
    q, k = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    scores = scores.masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 10, 32) @ w[a + "o_proj.weight"].T
    h = h + attn
    m = _rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
    m = (torch.nn.functional.silu(m @ w["midlayer.mlp.gate_proj.weight"].T)
         * (m @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
    prenorm = h + m
    normed = _rms(prenorm, w["norm.weight"], eps)
    logits = normed @ w["lm_head.weight"].T
    got_fed_back, got_logits = d(ids, tiny.hidden[:1, :10])
    want_fed_back = normed if options.get("norm_output") else prenorm
    torch.testing.assert_close(got_fed_back, want_fed_back, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_logits, logits, rtol=1e-5, atol=1e-5)


def test_checkpoint_is_what_vllm_loads(tiny, tmp_path):
    out = save_draft(tiny.draft, tiny.layout, tiny.vocab, tmp_path / "draft", extra={"step": 7})
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    cfg = read_config(out)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 2, 3],
                                   "use_aux_hidden_state": True, "norm_before_fc": False}
    assert cfg["num_aux_hidden_states"] == 3 and cfg["num_hidden_layers"] == 1
    assert (cfg["vocab_size"], cfg["draft_vocab_size"], cfg["target_hidden_size"]) == (96, 64, 32)
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["intermediate_size"]) == (32, 4, 2, 8, 64)
    assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "float32"
    assert cfg["rope_parameters"]["rope_theta"] == 5000.0 and cfg["rope_theta"] == 5000.0
    assert cfg[LAYOUT_KEY] == tiny.layout.to_dict() and cfg["eyas_extra"] == {"step": 7}
    assert cfg[MODEL_ARGS_KEY] == asdict(tiny.config)  # the constructor's arguments, as given
    tensors = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == VLLM_TENSORS
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    # d2t is an offset: draft id + d2t = the chosen target ids, ascending
    chosen = torch.nonzero(tensors["t2d"]).flatten()
    torch.testing.assert_close(torch.arange(64) + tensors["d2t"], chosen, rtol=0, atol=0)
    assert not torch.equal(tensors["d2t"], chosen)  # (the test vocab has gaps)
    # transformers (which vLLM uses to read it) sees the same numbers
    hf_cfg = AutoConfig.from_pretrained(out)
    assert (hf_cfg.head_dim, hf_cfg.rope_parameters["rope_theta"], hf_cfg.draft_vocab_size) == \
        (8, 5000.0, 64)


@pytest.fixture
def trained(tiny):
    """The tiny draft moved off its init values, so a load that skipped a tensor shows."""
    from eyas.draft.eagle3.model import Eagle3Draft
    torch.manual_seed(1)
    draft = Eagle3Draft(tiny.config, tiny.embed, tiny.vocab)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    return draft


def _same_outputs(tiny, want, got):
    for a, b in zip(want(tiny.ids, tiny.hidden), got(tiny.ids, tiny.hidden)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_save_load_round_trip_gives_identical_outputs(tiny, trained, tmp_path):
    save_draft(trained, tiny.layout, tiny.vocab, tmp_path)
    loaded = load(tmp_path, tiny.embed.weight, expected_layout=tiny.layout)
    assert loaded.layout == tiny.layout and loaded.draft.vocab.equals(tiny.vocab)
    assert loaded.draft.config == tiny.config and not loaded.d2t_missing
    assert loaded.claims.format == "eyas"
    _same_outputs(tiny, trained, loaded.draft)


def test_a_draft_saved_before_model_args_loads_from_what_vllm_reads(tiny, trained, tmp_path):
    save_draft(trained, tiny.layout, tiny.vocab, tmp_path)
    cfg = read_config(tmp_path)
    del cfg[MODEL_ARGS_KEY]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = load(tmp_path, tiny.embed)
    assert loaded.draft.config == tiny.config
    _same_outputs(tiny, trained, loaded.draft)
    # arguments that contradict what vLLM reads: eyas would rebuild another draft than served
    cfg[MODEL_ARGS_KEY] = {**asdict(tiny.config), "rms_norm_eps": 0.5}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LayoutError, match=r"differ on \['rms_norm_eps'\]"):
        load(tmp_path, tiny.embed)


def test_load_refuses_another_layout_naming_both(tiny, tmp_path):
    save_draft(tiny.draft, tiny.layout, tiny.vocab, tmp_path)
    shifted = HiddenStateLayout.from_names(tiny.layout.target,
                                           ["block_out:1", "block_out:2", "block_out:3"])
    with pytest.raises(LayoutError, match=r"block_out:3.*vs.*embed") as err:
        load(tmp_path, tiny.embed, expected_layout=shifted)
    assert str(tmp_path) in str(err.value)
    cfg = read_config(tmp_path)
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # hand-edited ids: refused, not served
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LayoutError, match="differs from eagle_config"):
        load(tmp_path, tiny.embed)
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LayoutError, match=r"\[1, 2, 3\] do not compile from its own layout"):
        load(tmp_path, tiny.embed)
    # the doctor examines it instead: the claim is the recorded layout, what vLLM reads is kept
    examined = load(tmp_path, tiny.embed, examine=True)
    assert examined.layout == tiny.layout and examined.claims.view.ids == [1, 2, 3]


def test_load_serves_the_vocabulary_as_vllm_does(tiny, trained, tmp_path):
    """vLLM reads d2t only: a t2d that disagrees is rebuilt from d2t, a missing d2t is the
    identity (draft id i = target id i), flagged; tensor names and dtypes are vLLM's."""
    save_draft(trained, tiny.layout, tiny.vocab, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    save_file({**tensors, "t2d": torch.ones_like(tensors["t2d"])},
              str(tmp_path / "model.safetensors"))
    loaded = load(tmp_path, tiny.embed)
    assert loaded.draft.vocab.equals(tiny.vocab) and not loaded.d2t_missing
    save_file({k: v for k, v in tensors.items() if k != "d2t"},
              str(tmp_path / "model.safetensors"))
    loaded = load(tmp_path, tiny.embed)
    assert loaded.d2t_missing and not loaded.draft.d2t.any()
    _same_outputs(tiny, trained, loaded.draft)  # the logits: only the map differs
    save_file({**tensors, "d2t": tensors["d2t"].int()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="d2t is torch.int32 .64,., vLLM expects torch.int64"):
        load(tmp_path, tiny.embed)
    save_file({**tensors, "extra.weight": torch.ones(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected \['extra.weight'\]"):
        load(tmp_path, tiny.embed)


def test_a_draft_that_does_not_say_its_slots_is_refused_unless_examined(tiny, tmp_path):
    from foreign_drafts import as_eagle3

    save_draft(tiny.draft, tiny.layout, tiny.vocab, tmp_path / "eyas")
    foreign = as_eagle3(tmp_path / "eyas", tmp_path / "foreign")  # no ids, no eyas keys
    with pytest.raises(LayoutError, match="refusing to guess"):
        load(foreign, tiny.embed)  # without the target, only eyas's own format is read
    with pytest.raises(LayoutError, match="does not say which target tensors.*eyas doctor draft="):
        load(foreign, tiny.embed, tiny.layout.target)
    examined = load(foreign, tiny.embed, tiny.layout.target, examine=True)
    assert examined.layout is None and examined.claims.format == "eagle3"
    said = load(as_eagle3(tmp_path / "eyas", tmp_path / "said", top=[0, 2, 3]), tiny.embed,
                tiny.layout.target, expected_layout=tiny.layout)
    assert said.layout.names == tiny.layout.names and said.claims.format == "eagle3"


def test_save_refuses_what_does_not_fit(tiny, tmp_path):
    two = HiddenStateLayout.from_names(tiny.layout.target, ["embed", "block_out:2"])
    with pytest.raises(LayoutError, match="expects 3 hidden-state slots but the layout has 2"):
        save_draft(tiny.draft, two, tiny.vocab, tmp_path)
    unsorted = HiddenStateLayout.from_names(tiny.layout.target,
                                            ["block_out:2", "embed", "block_out:1"])
    with pytest.raises(LayoutError, match="cannot be expressed"):
        save_draft(tiny.draft, unsorted, tiny.vocab, tmp_path)
    other = build_vocab(torch.arange(96), 64)
    with pytest.raises(ValueError, match="differs from the d2t/t2d"):
        save_draft(tiny.draft, tiny.layout, other, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written
