"""Tiny HF targets built locally (no hub): Llama, Qwen3 and DeepSeek-V3 (MLA + MoE)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

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
    import dataclasses

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


def extract_tiny(target_dir, prepare_dir, out_dir, stages=1, **cfg):
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
    return extract_dataset(prepare_dir, out_dir, layout, tokenizer, ecfg, executor, forward)




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
