"""The trained world: what the evaluator, the doctor and the gap alarm are tested on, built
once per session by tests/conftest.py (`trained_world`), its drafts trained by the product's
trainer (eyas.train.loop.train_draft).

A tiny trained Llama target, its extraction (layout [embed, block_out:1, block_out:3] + a
probe set of every layer) and a draft trained on it. The target learns a rule a one-layer
draft can't read from its token input alone: in the conversations, each letter is f(the
letter two before), f a fixed permutation. The draft at row r sees token r+1 and must say
f(token r): it leans on the target's states at row r, so feeding it the wrong slots costs
accuracy, which is the doctor's evidence."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from eyas.conventions import hf
from eyas.extract.shards import probe_slots
from eyas.layout import HiddenStateLayout
from eyas.store.reader import ExtractedDataset, Sample
from eyas.targets.parts import TargetHead
from helpers import TrainingWorld, tiny_tokenizer, tiny_training_world

WORLD_SLOTS = ["embed", "block_out:1", "block_out:3"]
WORLD_LAYERS, WORLD_HIDDEN, WORLD_DRAFT_VOCAB, STEPS = 6, 32, 64, 3
LETTERS = "ABCDEFGHIJKLMNQRSTUVWXYZ"  # single tokens for the helper tokenizer, no merges
WORLD_EPOCHS = 25  # of 6 steps (96 samples, batches of 16)
# held-out samples, all of them the probe set: the doctor's evidence. The product's ce loss
# leaves a draft that tells embed from block_out:0 by less per token than a kl-trained one,
# so the evidence takes more tokens (48 samples, ~570 tokens) to be conclusive about it
WORLD_PROBE = 48


def world_settings():
    """(TrainConfig, DraftConfig) of the trained world's drafts: the product's recipe (ce loss,
    its schedule and clipping) over 96 samples, with two departures. The lm_head starts at
    random: the target's rows are scaled by its uneven final norm (`_train_target`). The norm
    options are off: the foreign formats the doctor is tested on (SpecForge, vLLM's MLA
    schema) cannot all express them, and a draft that normalises the whole concatenation
    before fc leans less on which slot is where, so the evidence decides fewer layouts."""
    from eyas.config import DraftConfig, TrainConfig

    return (TrainConfig(num_workers=1, ttt_steps=STEPS, epochs=WORLD_EPOCHS, batch_size=16,
                        lr=3e-3, lm_head_init="random", checkpoint_every=10**6, seed=0),
            DraftConfig(vocab_size=WORLD_DRAFT_VOCAB, norm_before_fc=False, fc_norm=False,
                        norm_before_residual=False, norm_output=False))


def rule_conversations(n: int, seed: int) -> list[list[dict]]:
    """[user: 6 letters, assistant: 8-14 more], letter t+1 = f(letter t-1)."""
    f = dict(zip(LETTERS, random.Random(0).sample(LETTERS, len(LETTERS))))
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = [rng.choice(LETTERS), rng.choice(LETTERS)]
        while len(s) < 6 + rng.randint(8, 14):
            s.append(f[s[-2]])
        out.append([{"role": "user", "content": "".join(s[:6])},
                    {"role": "assistant", "content": "".join(s[6:])}])
    return out


def _train_target(path: Path, steps: int = 200) -> None:
    """Teach the random target the rule, then make its final norm's gains uneven without
    changing its function (lm_head divides them back), as in real LMs: reading the verifier
    after the final norm then really gives other tokens. (eyas trains a target of its own only
    from the standard library's sources, eyas/targets/builtin.py: no product way to teach a
    given model a given rule.)"""
    torch.manual_seed(0)
    tok = tiny_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(path)
    docs = [torch.tensor(tok(tok.apply_chat_template(m, tokenize=False),
                             add_special_tokens=False)["input_ids"])
            for m in rule_conversations(1000, seed=5)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        pick = [docs[i] for i in torch.randint(0, len(docs), (16,), generator=gen)]
        ids = torch.nn.utils.rnn.pad_sequence(pick, batch_first=True,
                                              padding_value=tok.pad_token_id)
        labels = torch.nn.utils.rnn.pad_sequence(pick, batch_first=True, padding_value=-100)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        gains = torch.exp(torch.randn(model.config.hidden_size) * 1.5)
        model.model.norm.weight.mul_(gains)
        model.lm_head.weight.div_(gains)
    model.save_pretrained(path)


def all_slot_samples(model, ds: ExtractedDataset) -> list[Sample]:
    """The split's samples with every layer's output (as the probe set has), for drafts that
    are trained on other slots than the data records (the faults the doctor must find)."""
    slots = probe_slots(WORLD_LAYERS)
    out = []
    for i in range(len(ds)):
        s = ds[i]
        got = hf.capture(model, s.input_ids[None], slots)
        out.append(Sample(s.sample_id, s.input_ids, s.loss_mask,
                          {slot.name: got[slot][0] for slot in slots}))
    return out


class SampleData:
    """Training data held in memory, read by eyas.train.loop.train_draft as it reads an
    extraction's stored shards (eyas.train.data.StoredData's interface): the world's samples
    with every layer's states, so a draft can be trained on other slots than the extraction
    records, as a trainer that assembles its inputs wrongly does."""

    def __init__(self, layout: HiddenStateLayout, train: list[Sample], heldout: list[Sample]):
        self.layout, self.train, self._heldout = layout, train, heldout

    def __len__(self) -> int:
        return len(self.train)

    def token_rows(self):
        return ((s.input_ids, s.loss_mask) for s in self.train)

    def lengths(self) -> list[int]:
        return [len(s.input_ids) for s in self.train]

    def samples(self, step: int, rank: int, indices: list[int]) -> list[Sample]:
        return [self.train[i] for i in indices]

    def heldout(self):
        from eyas.extract.on_demand import SampleList
        return SampleList(self.layout, self._heldout)


def trained_on_slots(w, names, verifier: str = "final_prenorm"):
    """(a draft trained on these slots of the world's data, its training report), trained
    once per world: what a trainer feeding other tensors than it records produces."""
    layout = HiddenStateLayout.from_names(w.layout.target, list(names), verifier)
    key = (tuple(layout.names), verifier)
    if key not in w.faulty:
        out = w.base / "faulty" / "-".join([*layout.names, verifier]).replace(":", "")
        w.faulty[key] = train_world_draft(
            w, out, SampleData(layout, w.all_slots, w.all_slots_heldout))
    return w.faulty[key]


def train_world_draft(w, out: Path, data=None, train=None, settings=None):
    """(the draft, eyas.train.loop.train_draft's report) trained by the product's trainer at
    the world's settings (`world_settings`, unless given) on `data` (default: the world's
    extraction), written to out/draft; the draft as eyas.draft.load reads it, in eval mode."""
    import eyas.train.loop as loop
    from eyas.draft.load import load

    default_train, default_settings = world_settings()
    report = loop.train_draft(data if data is not None else str(w.data), str(w.target),
                              str(out), train or default_train, settings or default_settings)
    return load(report.draft_dir, w.embed).draft.eval(), report


@dataclass
class TrainedWorld(TrainingWorld):
    """The trained world: a taught target, its extraction, and a draft eyas's trainer trained
    on it (see above)."""

    model: Any = None  # the target, loaded
    layout: HiddenStateLayout | None = None  # the extraction's
    head: TargetHead | None = None
    embed: torch.Tensor | None = None
    train_samples: list = field(default_factory=list)
    all_slots: Any = None  # every layer's output per sample (all_slot_samples), train split
    all_slots_heldout: Any = None
    faulty: dict = field(default_factory=dict)  # trained_on_slots' drafts, by slots
    draft: Any = None  # in eval mode
    report: Any = None  # its TrainReport
    seconds: float = 0.0  # what building the world took

    @property
    def data(self) -> Path:
        return self.offline

    @property
    def draft_dir(self) -> Path:
        return Path(self.report.draft_dir)

    @property
    def vocab(self):
        return self.draft.vocab

    @property
    def draft_config(self):
        return self.draft.config

    @property
    def reported(self):  # what training measured over its last epoch
        return self.report.train_accuracy


def build_trained_world(base: Path) -> TrainedWorld:
    """The trained world (see above), built in `base`: `tiny_training_world`'s steps on the
    rule's data and a taught 6-block target, then a draft trained by eyas's trainer."""
    started = time.perf_counter()
    w = tiny_training_world(base, layers=WORLD_LAYERS, teach=_train_target,
                            make=rule_conversations, n_train=96, n_heldout=WORLD_PROBE,
                            slots=WORLD_SLOTS, probe_samples=WORLD_PROBE)
    model = AutoModelForCausalLM.from_pretrained(w.target).eval()
    train = ExtractedDataset(w.offline, "train")
    world = TrainedWorld(w.target, w.base, w.manifest, model, train.layout,
                         TargetHead.from_model(model), hf.decoder_parts(model)[0].weight,
                         [train[i] for i in range(len(train))], all_slot_samples(model, train),
                         all_slot_samples(model, ExtractedDataset(w.offline, "heldout")))
    world.draft, world.report = train_world_draft(world, base / "train")
    world.seconds = time.perf_counter() - started
    return world
