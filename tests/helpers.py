"""What tests share: tiny HF targets built locally (no hub: Llama, Qwen3 and DeepSeek-V3 with
MLA + MoE), prepared and extracted data on them, and a tiny draft setup. The trained world the
evaluator and the doctor are tested on is tests/world.py's; drafts in other tools' formats
are tests/foreign_drafts.py's."""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
from eyas.draft.vocab import build_vocab, count_tokens
from eyas.conventions import hf
from eyas.layout import HiddenStateLayout, TargetIdentity

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
    from eyas.extract import (Extraction, blocks_forward, extract_dataset, in_process_executor,
                              local_blocks)
    from eyas.layout import HiddenStateLayout
    from eyas.targets import identify, load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    identity = identify(target_dir, tokenizer)
    layout = HiddenStateLayout.from_names(identity, cfg.pop("slots", SLOTS))
    ecfg = ExtractConfig(**{"dtype": "float32", "samples_per_shard": 8, "batch_tokens": 512,
                            "stages_per_replica": stages, **cfg})
    forward = blocks_forward(local_blocks(str(target_dir), identity.num_layers, ecfg, "float32"))
    executor = in_process_executor(forward, layout, out_dir, ecfg, tokenizer.pad_token_id)
    return extract_dataset(Extraction(prepare_dir, out_dir, layout, tokenizer, ecfg, "float32",
                                      str(target_dir) if online else None), executor, forward)


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
    def online(self) -> Path:  # the online extraction (the probe set and held-out split)
        return self.base / "online"


def tiny_training_world(base: Path, online: bool = False, *, layers: int = 4, teach=None,
                        make=None, n_train: int = 24, n_heldout: int = 6, slots=SLOTS,
                        probe_samples: int = 4) -> TrainingWorld:
    """A tiny random target (with `teach`, taught by teach(path)), `n_train` prepared
    conversations of `make(n, seed)` (default: helper code) and their float32 extraction on
    `slots` (`offline`), and with `online` an online one (the probe set and held-out split) of the same data.
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


def tiny_store(base: Path):
    """(target, base, manifest): a 4-block Llama, its prepared demo chats and their
    extraction under `base` (the store tests' world)."""
    from eyas.targets import load_tokenizer

    target = make_tiny_target(base / "target", "llama", layers=4, hidden=32)
    prepare_tiny(base / "prepare", load_tokenizer(target))
    return target, base, extract_tiny(target, base / "prepare", base / "extract")


def flip_last_byte(path: Path) -> None:
    """Change one byte of a shard's tensor data: same size, header intact."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def give_eyas_weights(model, draft, head, name: str) -> None:
    """bench/peer_recipe.load_into_peer: the peer-objective tests' two sides, the same
    function the DFlash full-run comparison starts speculators' model from."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from peer_recipe import load_into_peer

    load_into_peer(model, draft, head, name)


def docs_tables():
    """docs/scripts/tables.py as a module (a script, not a package): the docs' generated
    tables and figures."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "docs" / "scripts" / "tables.py"
    spec = importlib.util.spec_from_file_location("tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
