"""What tests share: tiny HF targets built locally (no hub: Llama, Qwen3 and DeepSeek-V3 with
MLA + MoE), prepared and extracted data on them, a tiny draft setup, and the trained world the
evaluator and the doctor are tested on (built once per session by tests/conftest.py), its
drafts trained by the product's trainer (eyas.train.loop.train_draft). Drafts in other tools'
formats are tests/foreign_drafts.py's."""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from eyas.store.reader import ExtractedDataset, Sample
from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
from eyas.draft.vocab import build_vocab, count_tokens
from eyas.conventions import hf
from eyas.extract.shards import probe_slots
from eyas.layout import HiddenStateLayout, TargetIdentity
from eyas.targets.parts import TargetHead

TEXT = ("def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n"
        "        self.x = x\n        self.y = y\n") * 40


def engine_log_lines(output: str) -> list[str]:
    """What vLLM and Ray log at INFO ("INFO 12-02 07:35:32 [model.py:733] Resolved
    architecture", "Started a local Ray instance"), which a run keeps out of its output unless
    --debug."""
    import re

    return [line for line in output.splitlines()
            if re.search(r"\bINFO \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\]", line)
            or "Started a local Ray instance" in line]


def vllm_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("vllm") is not None


@lru_cache(maxsize=1)
def tiny_tokenizer():
    from eyas.targets.tokenizer import train_tokenizer
    return train_tokenizer([TEXT], vocab_size=320)


def tiny_config(family: str, vocab_size: int, layers: int = 4, hidden: int = 32):
    from transformers import DeepseekV3Config, LlamaConfig, Qwen3Config

    common = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * hidden,
                  max_position_embeddings=512, tie_word_embeddings=False)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=hidden // 4)
    if family == "deepseek_v3":
        return DeepseekV3Config(**{**common, "num_key_value_heads": 4}, moe_intermediate_size=16,
                                n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                                first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                n_group=1, topk_group=1)
    raise ValueError(family)


def make_tiny_target(path: Path, family: str = "llama", layers: int = 4, hidden: int = 32,
                     seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, len(tok), layers, hidden))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    import random
    rng = random.Random(seed)
    lines = TEXT.splitlines()
    out = []
    for _ in range(n):
        a = rng.randrange(0, len(lines) - 6)
        out.append([{"role": "user", "content": "\n".join(lines[a:a + 3])},
                    {"role": "assistant", "content": "\n".join(lines[a + 3:a + 3 + rng.randint(1, 3)])}])
    return out


SLOTS = ["embed", "block_out:1", "block_out:2"]


def prepare_tiny(prepare_dir: Path, tokenizer, n_train=24, n_heldout=6, make=None,
                 max_length: int = 256):
    """Prepared train/held-out splits of `make(n, seed)` conversations (default: helper code)."""
    from eyas.config import DataConfig
    from eyas.conversations.prepare import prepare_split
    from eyas.files import write_json
    from eyas.fingerprint import chat_template_fingerprint, tokenizer_fingerprint

    prepare_dir.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("heldout", n_heldout, 1)):
        prepare_split((make or conversations)(n, seed), tokenizer, max_length, "error",
                      prepare_dir / f"{split}.parquet", split, show_progress=False)
    write_json(prepare_dir / "manifest.json", {
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "chat_template_fingerprint": chat_template_fingerprint(tokenizer),
        "data": dataclasses.asdict(DataConfig())})


def extract_tiny(target_dir, prepare_dir, out_dir, stages=1, online=False, **cfg):
    from eyas.config import ExtractConfig
    from eyas.extract import extract_dataset, in_process_executor, local_blocks, blocks_forward
    from eyas.layout import HiddenStateLayout
    from eyas.targets import identify, load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    identity = identify(target_dir, tokenizer)
    layout = HiddenStateLayout.from_names(identity, cfg.pop("slots", SLOTS))
    ecfg = ExtractConfig(**{"dtype": "float32", "samples_per_shard": 8, "batch_tokens": 512,
                            "stages_per_replica": stages, **cfg})
    forward = blocks_forward(local_blocks(str(target_dir), identity.num_layers, ecfg, "float32"))
    executor = in_process_executor(forward, layout, out_dir, ecfg, tokenizer.pad_token_id)
    return extract_dataset(prepare_dir, out_dir, layout, tokenizer, ecfg, executor, forward,
                           online={"target_path": str(target_dir), "model_dtype": "float32"}
                           if online else None)


@dataclass
class TrainingWorld:
    """A tiny target, its prepared data and extraction(s): what the trainer's tests train on."""

    target: Path
    base: Path
    manifest: dict | None = None  # the online extraction's, where one was made

    @property
    def prepare(self) -> Path:
        return self.base / "prepare"

    @property
    def offline(self) -> Path:  # the float32 extraction of `slots`
        return self.base / "extract"

    @property
    def online(self) -> Path:  # the online extraction (the probe set only)
        return self.base / "online"


def tiny_training_world(base: Path, online: bool = False, *, layers: int = 4, teach=None,
                        make=None, n_train: int = 24, n_heldout: int = 6, slots=SLOTS,
                        probe_samples: int = 4) -> TrainingWorld:
    """A tiny random target (with `teach`, taught by teach(path)), `n_train` prepared
    conversations of `make(n, seed)` (default: helper code) and their float32 extraction on
    `slots` (`offline`), and with `online` an online one (the probe set only) of the same data.
    As is: what the trainer's tests train on (`tiny_train_settings`); `build_trained_world`
    builds the doctor's world with it."""
    from eyas.targets import load_tokenizer

    target = make_tiny_target(base / "target", "llama", layers=layers, hidden=32)
    if teach is not None:
        teach(target)
    prepare_tiny(base / "prepare", load_tokenizer(target), n_train, n_heldout, make)
    w = TrainingWorld(target, base)
    extract_tiny(target, w.prepare, w.offline, slots=slots, probe_samples=probe_samples)
    w.manifest = (extract_tiny(target, w.prepare, w.online, online=True, slots=slots,
                               probe_samples=probe_samples) if online else None)
    return w


def tiny_train_settings():
    """(TrainConfig, DraftConfig) of the trainer's tests: 2 epochs of 6 steps, checkpoints
    every 3."""
    from eyas.config import DraftConfig, TrainConfig

    return (TrainConfig(num_workers=1, ttt_steps=2, epochs=2, batch_size=4, lr=2e-3,
                        step_loss_decay=0.8, checkpoint_every=3, seed=0),
            DraftConfig(vocab_size=128))


def simulate_chain(outputs: list[list[int]], proposals, k: int, max_new_tokens: int):
    """Counters a greedy chain-drafting engine reports for these greedy outputs.

    `outputs[r]` is request r's greedy continuation, at least max_new_tokens + k long (the
    last verify step may accept tokens past max_new_tokens; engines count them).
    `proposals(r, committed)` -> the k tokens drafted after `committed` tokens of outputs[r].
    The first token comes from prefill; each step then drafts k, accepts the longest prefix
    equal to the target's greedy tokens, and emits one token more.
    """
    from eyas.acceptance import AcceptanceStats, verify_greedy

    accepted_per_round = []
    for r, out in enumerate(outputs):
        if len(out) < max_new_tokens + k:
            raise ValueError(f"output {r} has {len(out)} tokens; simulating needs "
                             f"max_new_tokens + k = {max_new_tokens + k}")
        pos = 1
        while pos < max_new_tokens:
            guess = torch.tensor(list(proposals(r, pos)))
            n, _ = verify_greedy(guess, torch.tensor(out[pos:pos + k + 1]))
            accepted_per_round.append(n)
            pos += n + 1
    return AcceptanceStats.from_rounds(accepted_per_round, k)


# -- a tiny random target and an untrained draft on it (draft model and TTT tests) ------
TINY_VOCAB, TINY_HIDDEN, TINY_DRAFT_VOCAB = 96, 32, 64
TINY_SLOTS = ["embed", "block_out:1", "block_out:2"]  # vLLM ids [0, 2, 3]


# an MLA (DeepSeek/Kimi) draft layer of the tiny width: q through a low rank, DeepSeek's YaRN
TINY_MLA = {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 6}
TINY_YARN = {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0,
             "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
             "mscale": 1.0, "mscale_all_dim": 1.0}


@dataclass
class TinySetup:
    """A random target with peaked outputs, its captured slots and an untrained draft."""

    cfg: LlamaConfig
    target: LlamaForCausalLM
    layout: HiddenStateLayout
    ids: torch.Tensor  # [B, T]
    hidden: torch.Tensor  # [B, T, slots x H]: the draft inputs, concatenated
    verifier: torch.Tensor
    mask: torch.Tensor  # the loss mask: the first 4 tokens are the prompt
    vocab: Any  # DraftVocab
    config: Eagle3Config
    embed: torch.nn.Embedding
    draft: Eagle3Draft


def tiny_setup(seed: int = 0, batch: int = 4, seq: int = 24, slots=TINY_SLOTS,
               mla: dict | None = None) -> TinySetup:
    """A random 4-block Llama target, its captured slots, a vocab and an untrained draft.

    The target's lm_head is scaled up so its distributions are peaked: a random target's are
    near uniform, and its argmax would be noise for accuracy tests to chase.
    """
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=TINY_HIDDEN, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      max_position_embeddings=128, rope_parameters={"rope_type": "default",
                                                                    "rope_theta": 5000.0})
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(40)
    layout = HiddenStateLayout.from_names(TargetIdentity("LlamaForCausalLM", 4, TINY_HIDDEN), slots)
    ids = torch.randint(0, TINY_VOCAB, (batch, seq))
    feats = hf.capture(target, ids, layout.slots)
    hidden = torch.cat([feats[s] for s in layout.draft_inputs], dim=-1)  # [B, T, 3*H]
    mask = torch.ones_like(ids)
    mask[:, :4] = 0  # a "prompt" that is not trained on
    vocab = build_vocab(count_tokens(zip(ids, mask), TINY_VOCAB), TINY_DRAFT_VOCAB)
    config = Eagle3Config.from_target(cfg, len(layout.draft_inputs), TINY_DRAFT_VOCAB)
    if mla:  # the RoPE part's width is the rotary's head_dim
        config = dataclasses.replace(config, mla=dict(mla), head_dim=mla["qk_rope_head_dim"],
                                     rope_parameters=dict(TINY_YARN))
    embed = hf.decoder_parts(target)[0]
    draft = Eagle3Draft(config, embed, vocab)
    return TinySetup(cfg, target, layout, ids, hidden, feats[layout.verifier], mask, vocab,
                     config, embed, draft)


# -- the trained world: what the evaluator, the doctor and the gap alarm are tested on --------
# A tiny trained Llama target, its extraction (layout [embed, block_out:1, block_out:3] + a
# probe set of every layer) and a draft trained on it by the product's trainer
# (eyas.train.loop.train_draft); tests/conftest.py builds it once per session (`trained_world`).
#
# The target learns a rule a one-layer draft can't read from its token input alone: in the
# conversations, each letter is f(the letter two before), f a fixed permutation. The draft at
# row r sees token r+1 and must say f(token r): it leans on the target's states at row r, so
# feeding it the wrong slots costs accuracy, which is the doctor's evidence.

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


def read_prepared(path):
    """(table, metadata) of a prepared split (metadata keys without the "eyas." prefix), checked
    to be one: what the tests read the prepare stage's output with."""
    import pyarrow.parquet as pq

    from eyas.conversations.prepare import FORMAT, META_PREFIX

    table = pq.read_table(path)
    raw = table.schema.metadata or {}
    metadata = {k.decode()[len(META_PREFIX):]: v.decode() for k, v in raw.items()
                if k.startswith(META_PREFIX.encode())}
    assert metadata.get("format") == FORMAT, f"{path}: not a prepared split ({metadata})"
    return table, metadata
