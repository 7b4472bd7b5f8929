"""Tiny random targets and drafts, built locally, for the engine measurements in docs/engines.md.

Shared by the scripts next to this file; nothing here is downloaded. vLLM's CPU attention
needs head_dim 64 (so hidden 256 with 4 heads), and its CPU MLA kernel needs head size 576
(kv_lora_rank 512 + qk_rope_head_dim 64), hence the sizes below.
"""
from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from anywhere: eyas is imported from this checkout
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TEXT = ("def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n"
        "        self.x = x\n        self.y = y\n") * 40


def _save(model_config, path: Path, seed: int) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from eyas.targets.tokenizer import train_tokenizer

    tok = train_tokenizer([TEXT], vocab_size=320)
    model_config.vocab_size = len(tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def llama(path: Path, layers: int = 4, seed: int = 0) -> Path:
    from transformers import LlamaConfig

    return _save(LlamaConfig(hidden_size=256, num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=512,
                             max_position_embeddings=512, tie_word_embeddings=False),
                 path, seed)


def qwen3(path: Path, layers: int = 4, seed: int = 0) -> Path:
    from transformers import Qwen3Config

    return _save(Qwen3Config(hidden_size=256, num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64, intermediate_size=512,
                             max_position_embeddings=512, tie_word_embeddings=False),
                 path, seed)


def deepseek_v3(path: Path, layers: int = 4, seed: int = 0) -> Path:
    from transformers import DeepseekV3Config

    return _save(DeepseekV3Config(
        hidden_size=256, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=512, moe_intermediate_size=64, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
        topk_group=1, kv_lora_rank=512, q_lora_rank=64, qk_rope_head_dim=64,
        qk_nope_head_dim=64, v_head_dim=64, topk_method="noaux_tc", scoring_func="sigmoid",
        max_position_embeddings=512, tie_word_embeddings=False), path, seed)


def draft(target_dir: Path, slots: list[str], path: Path, seed: int = 0) -> Path:
    """An untrained eyas EAGLE-3 draft for `target_dir` over `slots`, saved as vLLM loads it."""
    import torch
    from transformers import AutoConfig

    from eyas.draft.checkpoint import save_draft
    from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
    from eyas.draft.vocab import build_vocab
    from eyas.layout import HiddenStateLayout
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    layout = HiddenStateLayout.from_names(identify(target_dir), slots)
    embed, _ = target_parts(target_dir)
    vocab = build_vocab(torch.arange(embed.shape[0], 0, -1).double(), 64)
    config = Eagle3Config.from_target(AutoConfig.from_pretrained(target_dir), len(slots), 64)
    torch.manual_seed(seed)
    return save_draft(Eagle3Draft(config, embed, vocab), layout, vocab, path)


def prompts(target_dir: Path, n: int = 2) -> list[list[int]]:
    from eyas.targets import load_tokenizer

    tok = load_tokenizer(target_dir)
    lines = TEXT.splitlines()
    return [tok("\n".join(lines[i:i + 3]))["input_ids"] for i in range(n)]


def records():
    """bench/record.py, whose provenance() and write() a script's --json record is made with."""
    sys.path.insert(0, str(ROOT / "bench"))
    import record

    return record


def rss_gib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def versions() -> str:
    import torch
    import transformers
    import vllm

    return (f"vllm {vllm.__version__}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}")
