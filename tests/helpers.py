"""What tests share: tiny HF targets built locally (no hub: Llama, Qwen3 and DeepSeek-V3 with
MLA + MoE), prepared and extracted data on them, a tiny draft setup, and the trained world the
evaluator and the doctor are tested on (built once per session by tests/conftest.py). Drafts
in other tools' formats are tests/foreign_drafts.py's."""
from __future__ import annotations

import dataclasses
import random
import time
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from eyas.dataset.reader import ExtractedDataset, Sample
from eyas.draft.accuracy import DURING_TRAINING, collate, during_training_record
from eyas.draft.checkpoint import save_draft
from eyas.draft.model import Eagle3Config, Eagle3Draft
from eyas.draft.ttt import decay_weights, ttt_loss
from eyas.draft.vocab import build_vocab, count_tokens
from eyas.engines import hf
from eyas.extract.shards import probe_slots
from eyas.layout import HiddenStateLayout, TargetIdentity
from eyas.target.parts import TargetHead

TEXT = ("def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n"
        "        self.x = x\n        self.y = y\n") * 40


def vllm_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("vllm") is not None


@lru_cache(maxsize=1)
def tiny_tokenizer():
    from eyas.target.tokenizer import train_tokenizer
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


def prepare_tiny(prepare_dir: Path, tokenizer, n_train=24, n_heldout=6, make=None):
    """Prepared train/held-out splits of `make(n, seed)` conversations (default: helper code)."""
    from eyas.config import DataConfig
    from eyas.data.prepare import prepare_split
    from eyas.files import write_json
    from eyas.fingerprint import chat_template_fingerprint, tokenizer_fingerprint

    prepare_dir.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("heldout", n_heldout, 1)):
        prepare_split((make or conversations)(n, seed), tokenizer, 256, "error",
                      prepare_dir / f"{split}.parquet", split, show_progress=False)
    write_json(prepare_dir / "manifest.json", {
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "chat_template_fingerprint": chat_template_fingerprint(tokenizer),
        "data": dataclasses.asdict(DataConfig())})


def extract_tiny(target_dir, prepare_dir, out_dir, stages=1, online=False, **cfg):
    from eyas.config import ExtractConfig
    from eyas.extract import extract_dataset, in_process_executor, local_blocks, blocks_forward
    from eyas.layout import HiddenStateLayout
    from eyas.target import identify, load_tokenizer

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




def tiny_training_world(base: Path, online: bool = False) -> SimpleNamespace:
    """A tiny random target, 24 prepared conversations and their float32 extraction
    (`offline`), and with `online` an online one (the probe set only) of the same data: what
    the trainer's tests train on (TINY_TRAIN, TINY_DRAFT)."""
    from eyas.target import load_tokenizer

    target = make_tiny_target(base / "target", "llama", layers=4, hidden=32)
    prepare_tiny(base / "prepare", load_tokenizer(target))
    w = SimpleNamespace(target=target, base=base, prepare=base / "prepare",
                        offline=base / "extract", online=base / "online")
    extract_tiny(target, w.prepare, w.offline)
    w.manifest = extract_tiny(target, w.prepare, w.online, online=True) if online else None
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


def tiny_setup(seed: int = 0, batch: int = 4, seq: int = 24, slots=TINY_SLOTS,
               mla: dict | None = None) -> SimpleNamespace:
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
    return SimpleNamespace(cfg=cfg, target=target, layout=layout, ids=ids, hidden=hidden,
                           verifier=feats[layout.verifier], mask=mask, vocab=vocab,
                           config=config, embed=embed, draft=draft)


# -- the trained world: what the evaluator, the doctor and the gap alarm are tested on --------
# A tiny trained Llama target, its extraction (layout [embed, block_out:1, block_out:3] + a
# probe set of every layer) and a draft trained on it; tests/conftest.py builds it once per
# session (`trained_world`).
#
# The target learns a rule a one-layer draft can't read from its token input alone: in the
# conversations, each letter is f(the letter two before), f a fixed permutation. The draft at
# row r sees token r+1 and must say f(token r): it leans on the target's states at row r, so
# feeding it the wrong slots costs accuracy, which is the doctor's evidence.

WORLD_SLOTS = ["embed", "block_out:1", "block_out:3"]
WORLD_LAYERS, WORLD_HIDDEN, WORLD_DRAFT_VOCAB, STEPS = 6, 32, 64, 3
LETTERS = "ABCDEFGHIJKLMNQRSTUVWXYZ"  # single tokens for the helper tokenizer, no merges


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
    after the final norm then really gives other tokens."""
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


def train_draft(w, layout: HiddenStateLayout, iterations: int, samples=None, start=None):
    """A draft trained with ttt_loss on `layout`'s slots of the train split (from `start`'s
    weights if given); returns it and what training records, as eyas/train does: in-vocab
    accuracy per TTT step counted over the last epoch's batches while training (the
    draft config's eyas_extra entries)."""
    samples = samples or w.train_samples
    torch.manual_seed(0)
    draft = Eagle3Draft(w.draft_config, w.embed, w.vocab)
    if start is not None:  # no lm_head warm start: the target's is scaled by its uneven norm
        draft.load_state_dict(start.state_dict())
    opt = torch.optim.Adam([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    weights = decay_weights(STEPS, 0.8)
    gen = torch.Generator().manual_seed(0)
    last_epoch = iterations - len(samples) // 16
    counts = torch.zeros(STEPS, 2, dtype=torch.float64)  # [k, (correct, in_vocab)]
    for i in range(iterations):
        pick = torch.randperm(len(samples), generator=gen)[:16].tolist()
        result = ttt_loss(draft, collate([samples[i] for i in pick], layout), w.head, STEPS,
                          weights)
        if i >= last_epoch:
            counts += torch.tensor([[float(s.correct), float(s.in_vocab)] for s in result.steps],
                                   dtype=torch.float64)
        opt.zero_grad()
        result.loss.backward()
        opt.step()
    record = during_training_record(counts[:, 0].tolist(), counts[:, 1].tolist(),
                                    iterations - last_epoch, last_epoch + 1)
    return draft.eval(), record


def build_trained_world(base: Path) -> SimpleNamespace:
    """The trained world (see above), built in `base`."""
    started = time.perf_counter()
    target = make_tiny_target(base / "target", "llama", layers=WORLD_LAYERS, hidden=WORLD_HIDDEN)
    _train_target(target)
    prepare_tiny(base / "prepare", tiny_tokenizer(), 96, 24, rule_conversations)
    extract_tiny(target, base / "prepare", base / "extract", slots=WORLD_SLOTS, probe_samples=24)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    train = ExtractedDataset(base / "extract", "train")
    samples = [train[i] for i in range(len(train))]
    counts = count_tokens(((s.input_ids, s.loss_mask) for s in samples),
                          model.config.vocab_size)
    w = SimpleNamespace(base=base, target=target, model=model, layout=train.layout,
                        data=base / "extract", head=TargetHead.from_model(model),
                        embed=hf.decoder_parts(model)[0].weight,
                        vocab=build_vocab(counts, WORLD_DRAFT_VOCAB), train_samples=samples)
    w.draft_config = Eagle3Config.from_target(model.config, len(WORLD_SLOTS), WORLD_DRAFT_VOCAB)
    w.draft, w.record = train_draft(w, w.layout, iterations=150)
    w.reported = w.record[DURING_TRAINING]
    w.draft_dir = save_draft(w.draft, w.layout, w.vocab, base / "draft", extra=w.record)
    w.all_slots = all_slot_samples(model, train)
    w.seconds = time.perf_counter() - started
    return w
