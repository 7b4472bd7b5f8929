"""The built-in target: a small Llama trained here, on Python's standard-library sources.

eyas needs a real causal LM to extract hidden states from, and no model hub may be reachable.
So it trains one: a byte-level BPE tokenizer and a few-layer `LlamaForCausalLM` on the standard
library's code, mixed with "continue this code" chat conversations so that the model answers
in its own chat format (the prepare stage renders prompts with that template).

The build is deterministic for a config on one machine, and cached under a key of everything
that shapes the weights (eyas/targets/cache.py: atomic, locked, checksummed, rebuilt when
damaged), so every stage and every worker that asks gets the same target.
"""
from __future__ import annotations

import logging
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from eyas.config import BuiltinTargetConfig
from eyas.targets.cache import cached_build
from eyas.fingerprint import json_digest
from eyas.targets.corpus import SourceFile, stdlib_sources
from eyas.targets.tokenizer import train_tokenizer

log = logging.getLogger(__name__)

BUILDER_VERSION = 1  # bump when the recipe changes; part of the cache key

# Recipe constants (changing one means bumping BUILDER_VERSION).
# Several window shapes, so the target has seen short and long prompts and answers.
_CHAT_SHAPES = ((12, 8), (6, 4), (20, 10))  # (prompt_lines, completion_lines)
_CHATS_PER_FILE_PER_SHAPE = 2  # ~20% of training characters end up in conversations
_CHAT_MULTI_TURN_FRACTION = 0.25
_MIN_LR_RATIO = 0.1


@dataclass(frozen=True)
class BuiltTarget:
    path: Path  # HF model directory: config, safetensors weights, tokenizer with chat template
    report: dict  # the build report, also saved as <path>/eyas_build.json
    cached: bool  # True when it came from the cache


def continuation_conversations(files: Sequence[SourceFile | str], n: int, prompt_lines: int,
                               completion_lines: int, seed: int,
                               multi_turn_fraction: float = 0.0) -> list[list[dict]]:
    """Up to `n` "continue this code" conversations cut from `files` (deterministic for `seed`).

    Each is `[user: the prompt lines in a python fence, assistant: the next lines]`, and with
    probability `multi_turn_fraction` also `[user: "Continue.", assistant: the lines after]`.
    Windows whose prompt or any answer is blank are skipped, so fewer than `n` may come back
    when the files are short or mostly blank.
    """
    texts = [f.text if isinstance(f, SourceFile) else f for f in files]
    docs = [t.splitlines() for t in texts]
    rng = random.Random(seed)
    # Weighted by the number of windows a file offers, so every window is equally likely.
    weights = {turns: [max(0, len(lines) - prompt_lines - turns * completion_lines + 1)
                       for lines in docs] for turns in (1, 2)}
    out: list[list[dict]] = []
    for _ in range(20 * n):  # bounded: blank windows are retried, but not forever
        if len(out) >= n:
            break
        turns = 2 if rng.random() < multi_turn_fraction else 1
        span = prompt_lines + turns * completion_lines
        if not any(weights[turns]):
            continue
        lines = rng.choices(docs, weights=weights[turns])[0]
        start = rng.randrange(len(lines) - span + 1)
        prompt = lines[start:start + prompt_lines]
        answers = [lines[start + prompt_lines + k * completion_lines:
                         start + prompt_lines + (k + 1) * completion_lines] for k in range(turns)]
        if not "".join(prompt).strip() or any(not "".join(a).strip() for a in answers):
            continue
        code = "\n".join(prompt)
        messages = [{"role": "user",
                     "content": f"Continue this Python code:\n```python\n{code}\n```"},
                    {"role": "assistant", "content": "\n".join(answers[0])}]
        for a in answers[1:]:
            messages += [{"role": "user", "content": "Continue."},
                         {"role": "assistant", "content": "\n".join(a)}]
        out.append(messages)
    return out


def builtin_cache_key(cfg: BuiltinTargetConfig, corpus_fingerprint: str) -> str:
    import torch

    knobs = {k: v for k, v in asdict(cfg).items() if k != "cache_dir"}
    return json_digest({"cfg": knobs, "corpus": corpus_fingerprint,
                        "builder": BUILDER_VERSION, "torch": torch.__version__})


def build_builtin_target(cfg: BuiltinTargetConfig, progress: bool = True) -> BuiltTarget:
    """The built-in target for `cfg`: the cached build when intact, else a new build (a damaged
    cache is said in one line, naming the directory, file and check, and rebuilt)."""
    corpus = stdlib_sources(cfg.heldout_fraction, cfg.max_corpus_mb)
    key = builtin_cache_key(cfg, corpus.fingerprint)

    def build(tmp: Path) -> dict:
        log.info("building the built-in target (%d steps; cached afterwards)", cfg.train_steps)
        return _build(cfg, corpus, key, tmp, progress)
    path, report, cached = cached_build(cfg.cache_dir, f"builtin-{key}", build,
                                        "built-in target")
    return BuiltTarget(path, report, cached)


def _token_stream(files: Sequence[SourceFile], tokenizer, seed: int) -> list[int]:
    """Raw files and chat conversations from them, each ended by EOS, shuffled, concatenated."""
    texts = [f.text for f in files]
    for i, (p, c) in enumerate(_CHAT_SHAPES):
        convs = continuation_conversations(files, _CHATS_PER_FILE_PER_SHAPE * len(files), p, c,
                                           seed + i, _CHAT_MULTI_TURN_FRACTION)
        texts += [tokenizer.apply_chat_template(m, tokenize=False) for m in convs]
    docs = tokenizer(texts, add_special_tokens=False)["input_ids"]
    random.Random(seed).shuffle(docs)  # windows then straddle code and chat boundaries alike
    eos = tokenizer.eos_token_id
    return [t for doc in docs for t in (*doc, eos)]


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return _MIN_LR_RATIO + (1 - _MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def _build(cfg: BuiltinTargetConfig, corpus, key: str, out: Path, progress: bool) -> dict:
    import torch
    import transformers

    started = time.perf_counter()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
            torch.manual_seed(cfg.seed)
            stats = _train_and_save(cfg, corpus, out, progress)
    finally:
        torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)
    report = {
        "builder_version": BUILDER_VERSION,
        "cache_key": key,
        "cfg": asdict(cfg),
        **stats,
        "corpus": {
            "fingerprint": corpus.fingerprint,
            "train_files": len(corpus.train),
            "train_chars": sum(len(f.text) for f in corpus.train),
            "heldout_files": len(corpus.heldout),
            "heldout_chars": sum(len(f.text) for f in corpus.heldout),
        },
        "build_seconds": round(time.perf_counter() - started, 2),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
    }
    return report


def _train_and_save(cfg: BuiltinTargetConfig, corpus, out: Path, progress: bool) -> dict:
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from eyas.progress import progress as progress_bar

    tokenizer = train_tokenizer([f.text for f in corpus.train], cfg.vocab_size)
    train = torch.tensor(_token_stream(corpus.train, tokenizer, cfg.seed), dtype=torch.long)
    heldout = torch.tensor(_token_stream(corpus.heldout, tokenizer, cfg.seed), dtype=torch.long)
    T = cfg.seq_len
    if len(train) <= T + 1 or len(heldout) <= T + 1:
        raise ValueError(f"built-in target: {len(train)} train / {len(heldout)} held-out tokens, "
                         f"need more than seq_len+1={T + 1} each; raise "
                         "target.builtin.max_corpus_mb or heldout_fraction")

    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        dtype="float32"))
    V = model.config.vocab_size
    # No weight decay on norm gains: decaying them toward 0 only fights the residual stream.
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: _lr_factor(s, cfg.warmup_steps, cfg.train_steps))
    gen = torch.Generator().manual_seed(cfg.seed)
    offsets = torch.arange(T + 1)

    model.train()
    loss_val = float("nan")
    bar = progress_bar(range(cfg.train_steps), desc="building target", unit="step",
                       disable=not progress)
    for _ in bar:
        starts = torch.randint(0, len(train) - T - 1, (cfg.batch_size, 1), generator=gen)
        window = train[starts + offsets]
        logits = model(input_ids=window[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, V), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
        bar.set_postfix(loss=f"{loss_val:.3f}", refresh=False)
    bar.close()

    # Held-out score: non-overlapping windows over the first eval_tokens held-out tokens,
    # against a unigram model of the training stream (add-one smoothed) on the same targets.
    n_windows = max(1, min(cfg.eval_tokens, len(heldout) - 1) // T)
    windows = heldout[: n_windows * T + 1]
    inputs = windows[:-1].view(n_windows, T)
    targets = windows[1:].view(n_windows, T)
    model.eval()
    nll = 0.0
    with torch.no_grad():
        for i in range(0, n_windows, cfg.batch_size):
            logits = model(input_ids=inputs[i:i + cfg.batch_size]).logits
            nll += F.cross_entropy(logits.reshape(-1, V), targets[i:i + cfg.batch_size].reshape(-1),
                                   reduction="sum").item()
    counts = torch.bincount(train, minlength=V).double() + 1
    unigram_logp = (counts / counts.sum()).log()
    scored = targets.numel()
    heldout_loss = nll / scored
    unigram_loss = -unigram_logp[targets.reshape(-1)].sum().item() / scored

    # Chat answers end with <|end|>: a generation stops there, as well as at EOS.
    model.generation_config.eos_token_id = [tokenizer.eos_token_id,
                                            tokenizer.convert_tokens_to_ids("<|end|>")]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {
        "heldout_loss": round(heldout_loss, 4),
        "unigram_loss": round(unigram_loss, 4),
        "loss_ratio": round(heldout_loss / unigram_loss, 4),
        "heldout_ppl": round(math.exp(heldout_loss), 2),
        "unigram_ppl": round(math.exp(unigram_loss), 2),
        "heldout_tokens_scored": scored,
        "final_train_loss": round(loss_val, 4),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens_seen": cfg.train_steps * cfg.batch_size * T,
        "train_stream_tokens": len(train),
        "heldout_stream_tokens": len(heldout),
    }
