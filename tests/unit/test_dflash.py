"""The DFlash draft family (eyas/draft/dflash/): its per-position outputs against vLLM's way of
computing one drafting step, training, the checkpoint round trip, and the refusals of the ids
DFlash cannot express or that vLLM would read shifted."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from eyas.conventions import vllm_dflash
from eyas.draft.dflash.checkpoint import save_draft
from eyas.draft.dflash.model import DFlashConfig, DFlashDraft
from eyas.draft.vocab import build_vocab, choose_mask_token
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity

K = 3  # block of 4: bonus + 3 masks
TARGET = LlamaConfig(vocab_size=60, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=48, max_position_embeddings=128,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
SLOTS = ["block_out:0", "block_out:1", "block_out:3"]  # target_layer_ids [0, 1, 3]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def tiny_draft(layers=2, seed=0, draft_vocab=24) -> DFlashDraft:
    """Random weights, norms included (all-ones norms would hide a norm left out)."""
    torch.manual_seed(seed)
    embed = torch.randn(TARGET.vocab_size, TARGET.hidden_size)
    vocab = build_vocab(torch.arange(TARGET.vocab_size) % 7, draft_vocab)
    config = DFlashConfig.from_target(TARGET, len(SLOTS), draft_vocab, mask_token_id=5,
                                      block_size=K + 1, num_layers=layers)
    draft = DFlashDraft(config, embed, vocab)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand_like(p) * 1.5 + 0.5)
    return draft.eval()


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, theta):
    """x [heads, n, d] at `positions` [n], rotate-half form (vLLM's neox style)."""
    d = x.shape[-1]
    freqs = positions[:, None].double() / theta ** (torch.arange(0, d, 2).double() / d)
    cos, sin = (torch.cat([f, f], -1).float() for f in (freqs.cos(), freqs.sin()))
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def vllm_step(draft, ids, hidden, r, causal=False, hidden_norm=True):
    """One DFlash drafting step as vLLM computes it (qwen3_dflash.py, dflash.py), from the
    draft's weights alone: context = rows 0..r written into each layer's KV cache (k_norm,
    RoPE at 0..r, no input_layernorm), then one pass of [x_{r+1}, mask x K] at positions
    r+1..r+1+K attending [context ; block], non-causal. Logits [K, draft_vocab]."""
    c, w = draft.config, dict(draft.named_parameters())
    eps, theta = c.rms_norm_eps, c.rope_parameters["rope_theta"]
    heads, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    ctx = hidden[: r + 1] @ w["fc.weight"].T
    if hidden_norm:
        ctx = _rms(ctx, w["hidden_norm.weight"], eps)
    tokens = torch.tensor([int(ids[r + 1])] + [c.mask_token_id] * K)
    x = draft.embed_tokens.weight[tokens]
    ctx_pos, blk_pos = torch.arange(r + 1), torch.arange(r + 1, r + 2 + K)
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."

        def heads_of(t, n):
            return t.view(t.shape[0], n, d).transpose(0, 1)  # [n, tokens, d]

        kc = _rope(_rms(heads_of(ctx @ w[p + "self_attn.k_proj.weight"].T, kv),
                        w[p + "self_attn.k_norm.weight"], eps), ctx_pos, theta)
        vc = heads_of(ctx @ w[p + "self_attn.v_proj.weight"].T, kv)
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = _rope(_rms(heads_of(h @ w[p + "self_attn.q_proj.weight"].T, heads),
                       w[p + "self_attn.q_norm.weight"], eps), blk_pos, theta)
        k = _rope(_rms(heads_of(h @ w[p + "self_attn.k_proj.weight"].T, kv),
                       w[p + "self_attn.k_norm.weight"], eps), blk_pos, theta)
        v = heads_of(h @ w[p + "self_attn.v_proj.weight"].T, kv)
        keys = torch.cat([kc, k], 1).repeat_interleave(heads // kv, 0)
        values = torch.cat([vc, v], 1).repeat_interleave(heads // kv, 0)
        mask = torch.ones(K + 1, r + 2 + K, dtype=torch.bool)
        if causal:
            mask[:, r + 1:] = torch.ones(K + 1, K + 1, dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + out.transpose(0, 1).reshape(K + 1, heads * d) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
                 ) @ w[p + "mlp.down_proj.weight"].T
    return _rms(x, w["norm.weight"], eps)[1:] @ w["lm_head.weight"].T


def _inputs(draft, b=2, t=11, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, TARGET.vocab_size, (b, t), generator=g)
    return ids, torch.randn(b, t, draft.fc.in_features, generator=g) * 3


def test_draft_steps_equal_vllms_step_at_every_anchor():
    draft = tiny_draft()
    ids, hidden = _inputs(draft)
    with torch.no_grad():
        steps = draft.draft_steps(draft, ids, hidden, K)
        assert len(steps) == K
        for b in range(ids.shape[0]):
            for r in (0, 4, ids.shape[1] - 2):  # the first anchor, a middle one, the last
                want = vllm_step(draft, ids[b], hidden[b], r)
                got = torch.stack([logits[b, r] for _, logits in steps])
                assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (b, r)


def test_sampled_anchors_compute_the_full_passs_rows_and_nothing_else():
    """train.anchors: only the anchors' blocks are computed, each as the every-row pass does
    (so sampling changes which rows train, not what a row computes); the rest are 0."""
    draft = tiny_draft()
    ids, hidden = _inputs(draft, t=13)
    anchors = torch.zeros(ids.shape, dtype=torch.bool)
    anchors[0, [1, 5, 11]] = True
    anchors[1, [0, 7]] = True  # fewer anchors than sample 0: padded, then dropped
    with torch.no_grad():
        full = draft.draft_steps(draft, ids, hidden, K)
        some = draft.draft_steps(draft, ids, hidden, K, anchors=anchors)
    for (_, want), (_, got) in zip(full, some):
        assert torch.allclose(got[anchors], want[anchors], atol=1e-5, rtol=1e-5)
        assert not got[~anchors].any()


def _response_batch(loss_mask):
    from eyas.draft.ttt import TTTBatch
    b, t = loss_mask.shape
    return TTTBatch(torch.zeros(b, t, dtype=torch.long), torch.zeros(b, t, 3),
                    torch.zeros(b, t, 2), loss_mask, torch.ones(b, t))


def test_anchors_are_drawn_where_the_block_starts_and_drafts_in_the_response():
    """Row r's block starts at x_{r+1} and drafts x_{r+2} first: DFlash's reference trainers
    draw an anchor only where both are response tokens; fewer such rows than asked: all."""
    from eyas.draft.ttt import sample_anchors, step_positions
    mask = torch.zeros(2, 12, dtype=torch.long)
    mask[0, 3:11] = 1  # response x_3..x_10: rows 2..8 qualify
    mask[1, 5:8] = 1  # x_5..x_7: rows 4, 5
    batch = _response_batch(mask)
    anchors = sample_anchors(batch, 4, torch.Generator().manual_seed(0))
    assert anchors[0].sum() == 4 and set(anchors[0].nonzero().flatten().tolist()) <= set(range(2, 9))
    assert anchors[1].nonzero().flatten().tolist() == [4, 5]
    again = sample_anchors(batch, 4, torch.Generator().manual_seed(0))
    other = sample_anchors(batch, 4, torch.Generator().manual_seed(1))
    assert torch.equal(anchors, again) and not torch.equal(anchors, other)
    # train.loss_tokens=all puts the prompt's rows in the loss: they anchor blocks too
    prompt = sample_anchors(batch, 12, torch.Generator().manual_seed(0), all_tokens=True)
    assert prompt[1].nonzero().flatten().tolist() == list(range(10))  # x_1..x_11 real
    # the loss's rows per position are the anchors' scored rows, not every row's
    every = step_positions(batch, K)
    batch.anchors = anchors
    assert step_positions(batch, K)[0] == 6 < every[0]


def test_the_loss_on_anchors_is_the_mean_over_the_anchor_rows():
    """ttt_loss with anchors: position k's loss is the mean of its anchors' per-row
    cross-entropies, computed here from the every-row pass by hand."""
    from eyas.draft.ttt import _target_side, counted_rows, ttt_loss
    draft = tiny_draft()
    ids, hidden = _inputs(draft, t=12)
    mask = torch.ones_like(ids)
    mask[:, :3] = 0
    head = torch.nn.Linear(TARGET.hidden_size, TARGET.vocab_size, bias=False)
    batch = _response_batch(mask)
    batch.input_ids, batch.hidden = ids, hidden
    batch.verifier = torch.randn(*ids.shape, TARGET.hidden_size)
    anchors = torch.zeros_like(ids, dtype=torch.bool)
    anchors[0, [2, 4, 6]] = anchors[1, [3, 9]] = True
    batch.anchors = anchors
    with torch.no_grad():
        result = ttt_loss(draft, batch, head, K, step_weights=[1.0] * K, loss="ce")
        counted = counted_rows(batch)
        _, _, best = _target_side(head, batch.verifier, counted, draft.vocab, draft.t2d, "ce")
        full = draft.draft_steps(draft, ids, hidden, K)
    t = ids.shape[1]
    for k, (_, logits) in enumerate(full):
        s = k + 1
        rows = anchors[:, :t - s] & counted[:, s:]
        logp = logits[:, :t - s].log_softmax(-1).gather(-1, best[:, s:]).squeeze(-1)
        want = -(logp[rows]).mean()
        assert torch.allclose(result.steps[k].loss, want, atol=1e-5), k
        assert int(result.steps[k].positions) == int(rows.sum())


def test_a_causal_block_or_no_hidden_norm_is_another_function():
    """The rollout above is sensitive to what DFlash is: a causal block, or the context fed
    without hidden_norm, gives other logits than eyas's forward."""
    draft = tiny_draft()
    ids, hidden = _inputs(draft)
    with torch.no_grad():
        got = torch.stack([lg[0, 4] for _, lg in draft.draft_steps(draft, ids, hidden, K)])
        for damage in ({"causal": True}, {"hidden_norm": False}):
            off = (vllm_step(draft, ids[0], hidden[0], 4, **damage) - got).abs().max()
            assert off > 1e-2, damage


def test_the_block_size_it_was_trained_on_is_the_only_one_it_drafts():
    draft = tiny_draft()
    ids, hidden = _inputs(draft)
    with pytest.raises(ValueError, match="blocks of 4.*num_speculative_tokens=3"):
        draft.draft_steps(draft, ids, hidden, K + 1)
    # fewer positions are the first of the whole block (the doctor scores position 1 alone)
    whole = draft.draft_steps(draft, ids, hidden, K)
    first = draft.draft_steps(draft, ids, hidden, 1)
    assert len(first) == 1 and torch.equal(first[0][1], whole[0][1])


def _layout(names, target=None):
    target = target or TargetIdentity("LlamaForCausalLM", 4, TARGET.hidden_size)
    return HiddenStateLayout.from_names(target, names)


def test_ids_are_outputs_of_layers_and_the_embedding_is_refused(tmp_path):
    assert vllm_dflash.to_layer_ids(_layout(SLOTS)) == [0, 1, 3]
    assert vllm_dflash.to_layer_ids(_layout(["block_out:2", "final_prenorm"])) == [2, 3]
    with pytest.raises(LayoutError, match=r"cannot be fed the embedding output.*block_out:0"):
        vllm_dflash.to_layer_ids(_layout(["embed", "block_out:1", "block_out:3"]))
    draft = tiny_draft()
    with pytest.raises(LayoutError, match="embedding"):
        save_draft(draft, _layout(["embed", "block_out:1", "block_out:3"]), draft.vocab,
                   tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_save_then_load_is_the_same_draft(tmp_path):
    from eyas.draft.load import load

    draft = tiny_draft(layers=2)
    out = save_draft(draft, _layout(SLOTS), draft.vocab, tmp_path / "d", extra={"why": "test"})
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": 5, "target_layer_ids": [0, 1, 3],
                                       "causal": False}
    assert "eagle_config" not in config and vllm_dflash.IDS_PATH.split(".")[0] in config
    assert config["eyas_family"] == "dflash" and config["num_hidden_layers"] == 2
    loaded = load(out, draft.embed_tokens.weight)
    back = loaded.draft
    assert type(back) is DFlashDraft and back.config == draft.config
    assert loaded.layout.names == SLOTS and not loaded.d2t_missing
    mine, theirs = draft.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    ids, hidden = _inputs(draft)
    with torch.no_grad():
        assert torch.equal(draft(ids, hidden)[1], back(ids, hidden)[1])


def test_a_full_vocabulary_draft_has_no_d2t(tmp_path):
    from safetensors import safe_open

    from eyas.draft.load import load

    draft = tiny_draft(draft_vocab=TARGET.vocab_size)
    out = save_draft(draft, _layout(SLOTS), draft.vocab, tmp_path / "d")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert not names & {"d2t", "t2d", "embed_tokens.weight"}  # vLLM has no d2t parameter then
    assert load(out, draft.embed_tokens.weight).draft.vocab.size == TARGET.vocab_size


def test_the_mask_token_is_the_pads_unless_its_row_is_zero():
    vocab = build_vocab(torch.arange(10), 4)  # the draft vocab: target ids 6..9
    embed = torch.randn(10, 8)
    pad = LlamaConfig(pad_token_id=2)
    assert choose_mask_token(pad, embed, vocab) == 2
    embed[2] = 0  # HF zeroes the padding row: every mask would get the same zero query
    embed[5] = 0
    assert choose_mask_token(pad, embed, vocab) == 4  # highest non-zero id outside the vocab
    assert choose_mask_token(LlamaConfig(pad_token_id=None), embed, vocab) == 4


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from helpers import make_tiny_target

    return make_tiny_target(tmp_path_factory.mktemp("t") / "target")


def _saved(target_dir, out, names):
    """A random DFlash draft for the tiny target on `names`, saved by eyas."""
    from transformers import AutoConfig

    from eyas.targets import identify

    target = identify(target_dir)
    cfg = AutoConfig.from_pretrained(target_dir)
    torch.manual_seed(0)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    vocab = build_vocab(torch.arange(cfg.vocab_size), 32)
    draft = DFlashDraft(DFlashConfig.from_target(cfg, len(names), 32, 1, K + 1), embed, vocab)
    return save_draft(draft, HiddenStateLayout.from_names(target, names), vocab, out)


def test_the_block_it_was_trained_on_is_written_where_published_configs_keep_it(target_dir,
                                                                                tmp_path):
    """eyas's DFlash export carries `block_size` at the top of config.json, as SpecForge's and
    z-lab's published configs do; the doctor reads it there to say which k serves the draft
    (vLLM never reads it). Without it the doctor said nothing of the block, and
    bench/damage.py served a block of 4 with 15 drafts."""
    from eyas.doctor.static import examine

    out = _saved(target_dir, tmp_path / "d", ["block_out:0", "block_out:1", "block_out:2"])
    config = json.loads((out / "config.json").read_text())
    assert config["block_size"] == K + 1
    notes = examine(out, target_dir).notes
    assert any(f"trained on blocks of {K + 1}" in n and f"num_speculative_tokens = {K}" in n
               for n in notes), notes


def test_the_preboot_check_reads_dflash_ids_through_vllms_shift(target_dir, tmp_path):
    from eyas.engines.vllm_checks import check_draft_for_target

    right = _saved(target_dir, tmp_path / "right", ["block_out:0", "block_out:1", "block_out:2"])
    assert check_draft_for_target(target_dir, right) == [1, 2, 3]  # stream positions

    def rewritten(name, change):
        out = tmp_path / name
        out.mkdir()
        (out / "model.safetensors").symlink_to(right / "model.safetensors")
        config = json.loads((right / "config.json").read_text())
        change(config)
        (out / "config.json").write_text(json.dumps(config))
        return out

    # the classic off-by-one: ids written as stream indices (input of layer k)
    shifted = rewritten("shifted", lambda c: c["dflash_config"].update(target_layer_ids=[1, 2, 3]))
    with pytest.raises(LayoutError, match=r"target_layer_ids \[1, 2, 3\].*will feed "
                       r"\['block_out:1', 'block_out:2', 'block_out:3'\].*trained on "
                       r"\['block_out:0', 'block_out:1', 'block_out:2'\].*\[0, 1, 2\].*"
                       "one too high"):
        check_draft_for_target(target_dir, shifted)
    # with the last block among the slots, shifted ids point past the target
    last = _saved(target_dir, tmp_path / "last", ["block_out:0", "final_prenorm"])
    assert check_draft_for_target(target_dir, last) == [1, 4]
    past = rewritten("past", lambda c: c["dflash_config"].update(target_layer_ids=[1, 4]))
    past.joinpath("model.safetensors").unlink()
    past.joinpath("model.safetensors").symlink_to(last / "model.safetensors")
    with pytest.raises(LayoutError, match=r"\[4\] outside 0..3.*one too high"):
        check_draft_for_target(target_dir, past)
    # an eagle_config dict: vLLM's V1 runner would read it instead of dflash_config
    nested = rewritten("nested", lambda c: c.update(eagle_config={"use_aux_hidden_state": True}))
    with pytest.raises(LayoutError, match="runners read different ids"):
        check_draft_for_target(target_dir, nested)


def test_training_lowers_the_loss_and_saves_a_draft_load_reads(tmp_path):
    import dataclasses

    from eyas.draft.load import load
    from eyas.targets.parts import target_parts
    from eyas.train.loop import train_draft
    from helpers import tiny_train_settings, tiny_training_world

    w = tiny_training_world(tmp_path, slots=SLOTS)
    train, settings = tiny_train_settings()
    train = dataclasses.replace(train, epochs=6)  # 36 steps of 4 samples
    settings = dataclasses.replace(settings, family="dflash", block_size=K + 1, num_layers=2)
    report = train_draft(str(w.offline), str(w.target), str(tmp_path / "train"), train, settings)
    first, last = (sum(x) / len(x) for x in (report.losses[:3], report.losses[-3:]))
    assert math.isfinite(last) and last < 0.85 * first, report.losses
    loaded = load(report.draft_dir, target_parts(w.target)[0])
    assert type(loaded.draft) is DFlashDraft and loaded.draft.config.block_size == K + 1
    assert loaded.layout.names == SLOTS and len(loaded.draft.layers) == 2
    assert len(report.train_accuracy) == K  # one accuracy per block position


def test_training_on_sampled_anchors_lowers_the_loss(tmp_path):
    """train.anchors=2: two blocks per sample per step (of about ten eligible rows) still
    train the draft."""
    import dataclasses

    from eyas.train.loop import train_draft
    from helpers import tiny_train_settings, tiny_training_world

    w = tiny_training_world(tmp_path, slots=SLOTS)
    train, settings = tiny_train_settings()
    train = dataclasses.replace(train, epochs=6, anchors=2)
    settings = dataclasses.replace(settings, family="dflash", block_size=K + 1, num_layers=2)
    report = train_draft(str(w.offline), str(w.target), str(tmp_path / "train"), train, settings)
    first, last = (sum(x) / len(x) for x in (report.losses[:3], report.losses[-3:]))
    assert math.isfinite(last) and last < 0.85 * first, report.losses


def test_export_writes_it_for_vllm_and_refuses_sglang(tmp_path):
    """vLLM's copy is held to the DFlash reading of its ids (a shifted copy is refused);
    SGLang, whose DFlash serving eyas has not verified, is refused naming the family."""
    from eyas.serve.export import export_sglang, export_vllm

    draft = tiny_draft()
    out = save_draft(draft, _layout(SLOTS), draft.vocab, tmp_path / "d")
    assert json.loads((export_vllm(out, tmp_path / "v") / "config.json").read_text())[
        "dflash_config"]["target_layer_ids"] == [0, 1, 3]
    with pytest.raises(LayoutError, match="a dflash draft.*export it for vLLM"):
        export_sglang(out, tmp_path / "s")
    config = json.loads((out / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 2, 3]  # stream indices: one too high
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(LayoutError):
        export_vllm(out, tmp_path / "v2")


def test_a_block_draft_is_scored_one_sample_at_a_time(tmp_path, monkeypatch):
    """evaluate_draft batches a chain draft's samples, but a DFlash draft's one pass holds a
    block's scores against the whole context at every row (T^2 x block a sample: 8 chats of
    1024 tokens at a block of 16 passed 24 GiB), so its forward takes one sample whatever
    batch_size says; the counts are sums, so nothing else changes."""
    import dataclasses

    from eyas.draft import accuracy
    from eyas.train.data import StoredData
    from eyas.train.loop import build_draft
    from helpers import tiny_train_settings, tiny_training_world

    w = tiny_training_world(tmp_path, slots=SLOTS)
    data = StoredData(w.offline)
    _, settings = tiny_train_settings()
    seen, score = [], accuracy.score_batch
    monkeypatch.setattr(accuracy, "score_batch",
                        lambda d, batch, *a: seen.append(batch.input_ids.shape[0]) or score(
                            d, batch, *a))
    for family, want in (("dflash", {1}), ("eagle3", {4})):
        seen.clear()
        draft, head, _ = build_draft(data, str(w.target), dataclasses.replace(
            settings, family=family, block_size=K + 1 if family == "dflash" else None))
        got = accuracy.evaluate_draft(draft, data.train, head, K, batch_size=4,
                                      max_samples=8)
        assert set(seen) == want and got.samples == 8, (family, seen)
