"""P-EAGLE (draft.family=peagle): its TTT steps are vLLM's one causal pass per drafting step,
training lowers the loss, save -> load round-trips exactly, and the pre-boot check refuses a
draft whose ids are shifted by one."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from eyas.config import DraftConfig
from eyas.draft import families
from eyas.draft.directory import read_config
from eyas.draft.load import load, speculative_config
from eyas.conventions.kinds import draft_kind
from eyas.draft.peagle.model import PEagleConfig, PEagleDraft
from eyas.engines.vllm_checks import check_draft_for_target
from eyas.layout import LayoutError
from helpers import tiny_setup, tiny_train_settings, tiny_training_world

pytestmark = pytest.mark.usefixtures("one_thread")
OPTIONS = dict(norm_before_fc=True, fc_norm=True, norm_before_residual=True, norm_output=True)


def _peagle(s, layers: int = 2, seed: int = 1, **options) -> PEagleDraft:
    """A P-EAGLE draft on tiny_setup's target, its weights random (norms included, so that
    each is seen to matter)."""
    config = PEagleConfig.from_target(s.cfg, s.config.num_aux_hidden_states,
                                      s.config.draft_vocab_size, num_layers=layers,
                                      mask_token_id=s.cfg.vocab_size - 1,
                                      **(options or OPTIONS))
    draft = PEagleDraft(config, s.embed, s.vocab)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * (0.3 if "norm" in name else 0.05))
    return draft.eval()


def _vllm_step(draft, ids, hidden, r: int, k: int):
    """vLLM's drafting step with the context ending at row r (llm_base_proposer with
    parallel drafting): ONE causal pass over tokens [x_1..x_{r+1}, mask x (k-1)], hidden
    [fc(h_0..h_r), fc(mask_hidden) x (k-1)], positions 0..r+k-1; the last k rows' logits are
    the k drafts. Written from vLLM's kernel (_copy_and_expand_eagle_inputs), not from
    draft_steps."""
    b = ids.shape[0]
    tokens = torch.cat([ids[:, 1:r + 2],
                        torch.full((b, k - 1), draft.config.mask_token_id)], dim=1)
    context = draft.project(hidden[:, :r + 1])  # vLLM: combine_hidden_states(aux)
    masks = draft.project(draft.mask_hidden).expand(b, k - 1, -1)  # combine(mask_hidden)
    _, logits = draft(tokens, torch.cat([context, masks], dim=1), projected=True)
    return logits[:, -k:]  # [B, k, draft_vocab]


def test_draft_steps_are_vllms_one_pass_per_drafting_step():
    s = tiny_setup(seq=12)
    draft, k = _peagle(s), 3
    with torch.no_grad():
        steps = draft.draft_steps(draft, s.ids, s.hidden, k)
        for r in range(s.ids.shape[1] - 1):  # row r: the context ends at x_{r+1}
            want = _vllm_step(draft, s.ids, s.hidden, r, k)
            for j in range(k):
                torch.testing.assert_close(steps[j][1][:, r], want[:, j], rtol=1e-5,
                                           atol=1e-5)
    # the positions matter: at step k, row r is at r+k (a draft kept at r would differ)
    with torch.no_grad():
        stuck = draft.draft_steps(draft, s.ids, s.hidden, k, scheme="specforge")
    assert (stuck[2][1] - steps[2][1]).abs().max() > 1e-3


def test_training_lowers_the_loss(tmp_path):
    import eyas.train.loop as loop

    w = tiny_training_world(tmp_path / "world")
    train, _ = tiny_train_settings()
    settings = DraftConfig(vocab_size=128, family="peagle", num_layers=2)
    out = loop.train_draft(str(w.offline), str(w.target), str(tmp_path / "run"),
                           replace(train, ttt_steps=3), settings)
    assert len(out.losses) == 12 and out.losses[-1] < 0.95 * out.losses[0]
    config = read_config(out.draft_dir)
    assert config["eyas_family"] == "peagle" and config["num_hidden_layers"] == 2
    assert speculative_config(config) == {"method": "eagle3",
                                                   "parallel_drafting": True}


def test_save_load_round_trips_exactly(tmp_path):
    s = tiny_setup(seq=12)
    draft = _peagle(s, layers=3)
    families.get("peagle").save(draft, s.layout, s.vocab, tmp_path)
    config = read_config(tmp_path)
    assert config["mask_token_id"] == draft.config.mask_token_id
    assert config["num_hidden_layers"] == 3 and config["architectures"] == [
        "LlamaForCausalLMEagle3"]
    loaded = load(tmp_path, s.embed, expected_layout=s.layout)
    assert isinstance(loaded.draft, PEagleDraft) and loaded.claims.format == "eyas"
    assert loaded.draft.config == draft.config and loaded.layout == s.layout
    theirs, ours = loaded.draft.state_dict(), draft.state_dict()
    assert theirs.keys() == ours.keys()
    for name in ours:
        assert torch.equal(theirs[name], ours[name]), name
    with torch.no_grad():
        for a, b in zip(draft.draft_steps(draft, s.ids, s.hidden, 3),
                        loaded.draft.draft_steps(loaded.draft, s.ids, s.hidden, 3)):
            assert torch.equal(a[1], b[1])


def test_a_foreign_config_with_a_mask_id_reads_as_peagle(tmp_path):
    """Another trainer's P-EAGLE draft: an EAGLE-3 config whose mask id is `pard_token`,
    without eyas's keys: read by its ids, as vLLM reads them, and served in parallel."""
    s = tiny_setup(seq=12)
    draft = _peagle(s, layers=2)
    families.get("peagle").save(draft, s.layout, s.vocab, tmp_path)
    config = read_config(tmp_path)
    for key in ("eyas_layout", "eyas_model_args", "eyas_family", "mask_token_id"):
        del config[key]
    config["pard_token"] = draft.config.mask_token_id
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert draft_kind(config).name == "peagle"
    assert speculative_config(config)["parallel_drafting"] is True
    loaded = load(tmp_path, s.embed, s.layout.target, expected_layout=s.layout)
    assert isinstance(loaded.draft, PEagleDraft) and loaded.draft.config == draft.config
    # the doctor's --write-fixed: the same draft in eyas's own format, its layers and mask kept
    from eyas.draft.fixed import write_fixed
    fixed = write_fixed(tmp_path, tmp_path / "fixed", loaded.claims, s.layout, "vllm")
    again = load(fixed, s.embed)
    assert isinstance(again.draft, PEagleDraft) and again.draft.config == draft.config
    assert again.claims.format == "eyas" and again.layout == s.layout
    (tmp_path / "model.safetensors").unlink()
    from safetensors.torch import save_file
    save_file({k: v for k, v in draft.state_dict().items()
               if k not in ("embed_tokens.weight", "mask_hidden")},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(LayoutError, match="no mask_hidden"):
        load(tmp_path, s.embed, s.layout.target)


def test_the_preboot_check_passes_it_and_refuses_ids_shifted_by_one(tmp_path):
    s = tiny_setup(seq=12)
    s.target.save_pretrained(tmp_path / "target")
    draft_dir = families.get("peagle").save(_peagle(s), s.layout, s.vocab, tmp_path / "draft")
    assert check_draft_for_target(tmp_path / "target", draft_dir, s.layout) == [0, 2, 3]
    config = read_config(draft_dir)
    shifted = [i + 1 for i in config["eagle_aux_hidden_state_layer_ids"]]  # [1, 3, 4]
    config["eagle_aux_hidden_state_layer_ids"] = shifted
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = shifted
    (draft_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(LayoutError, match=r"vLLM will feed ids \[1, 3, 4\], but the draft "
                                          r"was trained on .* = ids \[0, 2, 3\]"):
        check_draft_for_target(tmp_path / "target", draft_dir)


def test_an_mla_layer_is_refused():
    s = tiny_setup(seq=8)
    with pytest.raises(ValueError, match="MLA layer"):
        PEagleDraft(replace(_peagle(s).config, mla={"kv_lora_rank": 4}), s.embed, s.vocab)


def test_specforges_peagle_config_is_refused_saying_what_vllm_serves(tmp_path):
    """SpecForge's PEagleDraftModel name: vLLM's method eagle3 renames it to a name its
    registry lacks, and eyas does not read it."""
    import shutil
    from pathlib import Path

    from safetensors.torch import save_file

    from eyas.layout import TargetIdentity

    shutil.copy(Path(__file__).parent.parent / "data/published_drafts/"
                "specforge__qwen3-8b-peagle.json", tmp_path / "config.json")
    save_file({"fc.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(LayoutError, match=r"P-EAGLE draft .*PEagleDraftModel.*"
                                          r"LlamaForCausalLMEagle3.*mask_token_id"):
        load(tmp_path, torch.zeros(8, 2), TargetIdentity("Qwen3ForCausalLM", 36, 4096))
