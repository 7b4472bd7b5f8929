"""Regeneration on prepare's own vLLM replicas against Ray Data's vLLM processor
(`ray.data.llm`): the same conversations, the same engine options, alternated in rounds on one
local Ray cluster.

    eyas bench regenerate-ray-data [--conversations 24] [--rounds 2] [--json PATH] [overrides ...]

Both sides rewrite every assistant turn in order through eyas's own round logic
(`eyas.conversations.regenerate.regenerate_conversations`: round r asks each conversation's r-th
answer in the context of the regenerated earlier ones); only the engine behind its `complete`
differs:

  replicas  prepare's GeneratorActor replicas (tasks/prepare.py, `data.generation.num_replicas`
            of them, each with its share of the cores), booted once and kept for every round
  ray-data  each round's prompts as a Ray Dataset through `ray.data.llm.build_processor` over a
            `vLLMEngineProcessorConfig` with the same engine options (EngineOptions.llm_kwargs,
            as prepare builds them) and the same per-request sampling (seeds included), as many
            engine actors as there are replicas, one CPU each. Ray Data starts a processor's
            engine actors for each dataset it runs, so every round boots its engines.

The conversations: the first N training (not held-out) records of the data's source, by default
the README's first command's (`experiment=chat`: SmolLM2-135M-Instruct on ShareGPT). Recorded per
round and side: seconds (boots included), generation rounds, answers and tokens; and whether the
two sides' conversations came out the same (greedy, so they should; a difference is counted,
not hidden).
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # record


def training_conversations(cfg, n: int) -> list[list[dict]]:
    """The first `n` usable training conversations of the config's data (ShareGPT's built-in
    file or the demo's), in file order, held-out ones skipped as prepare skips them."""
    from eyas.conversations import sharegpt
    from eyas.conversations.prepare import HELDOUT_FRACTION, demo_conversations

    if sharegpt.SOURCE not in [str(f) for f in (cfg.data.train_files or [])]:
        train, _ = demo_conversations(cfg.data.demo)
        return [list(m) for m in train[:n]]
    out = []
    for _, sample, messages in sharegpt.conversations(sharegpt.ReadCounts()):
        if not sharegpt.is_heldout(sample, HELDOUT_FRACTION):
            out.append(messages)
            if len(out) == n:
                break
    return out


class _Answers:
    """What a side's `complete` produced, call by call."""

    def __init__(self):
        self.answers = self.tokens = self.calls = 0
        self.seconds: list[list] = []  # per generation round: [prompts, seconds]

    def counted(self, complete):
        """`complete`, its calls, answers, tokens and seconds counted."""
        def wrapped(prompts, settings):
            started = time.perf_counter()
            out = complete(prompts, settings)
            self.calls += 1
            self.seconds.append([len(prompts), time.perf_counter() - started])
            self.answers += len(out)
            self.tokens += sum(len(ids) for ids, _ in out)
            return out
        return wrapped


def replicas_side(cfg, target_dir: str):
    """(complete, close): prepare's own replicas, booted now, kept for every round."""
    import ray

    from tasks.prepare import _complete_on, _generators

    actors = _generators(cfg, target_dir)
    ray.get([a.engine_version.remote() for a in actors])  # booted

    def close():
        for actor in actors:
            ray.kill(actor)
    return _complete_on(actors), close


def engine_kwargs(cfg) -> dict:
    """What prepare's replicas boot vLLM with (tasks/prepare.py `generator_options`), as vLLM
    engine arguments."""
    from tasks.prepare import generator_options

    kwargs = generator_options(cfg).llm_kwargs()
    kwargs.pop("use_tqdm_on_load", None)  # vllm.LLM's, not an engine argument
    return kwargs


def ray_data_side(cfg, target_dir: str):
    """(complete, close): every call one Ray Dataset through ray.data.llm's vLLM
    processor, its engine actors started for that dataset."""
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    from eyas.engines.vllm_engine import sampling

    from tasks.prepare import replica_threads

    replicas, threads = cfg.data.generation.num_replicas, replica_threads(cfg)
    config = vLLMEngineProcessorConfig(
        model_source=target_dir, engine_kwargs=engine_kwargs(cfg), batch_size=16,
        concurrency=replicas, placement_group_config={"bundles": [{"CPU": 1}]},
        chat_template_stage=False, tokenize_stage=False, detokenize_stage=False,
        log_engine_metrics=False,
        # one thread an engine, as each replica has (tasks/prepare.py replica_threads), unbound:
        # vLLM's CPU worker otherwise binds its threads to every core of the node
        runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT),
                                  "VLLM_CPU_OMP_THREADS_BIND": "nobind"}})
    processor = build_processor(config)

    def complete(prompts, settings):
        rows = [{"row": i, "tokenized_prompt": list(map(int, p)),
                 "sampling_params": sampling(settings, p)} for i, p in enumerate(prompts)]
        out = sorted(processor(ray.data.from_items(rows)).take_all(), key=lambda r: r["row"])
        if [r["row"] for r in out] != list(range(len(prompts))):
            raise SystemExit(f"ray.data.llm returned {len(out)} rows for {len(prompts)} prompts")
        return [(list(map(int, r["generated_tokens"])), r.get("finish_reason") == "stop")
                for r in out]
    return complete, lambda: None


SIDES = {"replicas": replicas_side, "ray-data": ray_data_side}


def one_round(side: str, cfg, target_dir: str, conversations, tokenizer) -> tuple[dict, list]:
    from eyas.conversations.regenerate import regenerate_conversations

    started, counter = time.perf_counter(), _Answers()
    complete, close = SIDES[side](cfg, target_dir)
    try:
        outcomes = regenerate_conversations(conversations, tokenizer, counter.counted(complete),
                                            cfg.data.generation, cfg.data.max_length)
    finally:
        close()
    seconds = time.perf_counter() - started
    row = {"side": side, "seconds": seconds, "generation_rounds": counter.calls,
           "answers": counter.answers, "tokens": counter.tokens,
           "tokens_per_s": counter.tokens / seconds, "per_generation_round": counter.seconds}
    print(f"{side}: {seconds:.1f} s, {counter.calls} generation rounds, {counter.answers} "
          f"answers, {counter.tokens} tokens ({row['tokens_per_s']:.1f} tokens/s)", flush=True)
    return row, [o.messages for o in outcomes]


def compare(a: list, b: list) -> dict:
    """How many conversations came out the same on both sides, and where the first differs."""
    same = sum(x == y for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return {"conversations": len(a), "same": same, "first_different": first}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--rounds", type=int, default=2,
                   help="alternated rounds: replicas then Ray Data, then Ray Data then replicas")
    p.add_argument("--json", type=Path)
    a, overrides = p.parse_known_args(argv)
    overrides = overrides or ["experiment=chat"]

    import ray
    import ray.data

    from eyas.targets import load_tokenizer, resolve_target
    from workflows.config import load_config

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False  # its per-operator lines
    cfg = load_config(overrides)
    target = resolve_target(cfg.target)
    tokenizer = load_tokenizer(target.path)
    conversations = training_conversations(cfg, a.conversations)
    ray.init(log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    kwargs = engine_kwargs(cfg)  # both sides' (replica_threads reads the Ray cluster)
    rows, same = [], []
    for r in range(a.rounds):
        order = ("replicas", "ray-data") if r % 2 == 0 else ("ray-data", "replicas")
        outputs = {}
        for side in order:
            row, outputs[side] = one_round(side, cfg, str(target.path), conversations, tokenizer)
            rows.append({"round": r + 1, **row})
        same.append({"round": r + 1, **compare(outputs["replicas"], outputs["ray-data"])})
        print(f"round {r + 1}: {same[-1]['same']} of {len(conversations)} conversations the "
              "same on both sides", flush=True)
    ray.shutdown()
    ratios = [next(x["seconds"] for x in rows if x["round"] == r and x["side"] == "ray-data")
              / next(x["seconds"] for x in rows if x["round"] == r and x["side"] == "replicas")
              for r in range(1, a.rounds + 1)]
    result = {"conversations": len(conversations), "overrides": overrides,
              "replicas": cfg.data.generation.num_replicas, "rows": rows, "same": same,
              "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}
    print(f"Ray Data / replicas: {result['ratio']:.2f} "
          f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")
    if a.json:
        from record import provenance, write
        shared = {"overrides": overrides, "conversations": len(conversations),
                  "generation": asdict(cfg.data.generation), "engine_kwargs": kwargs,
                  "engines": cfg.data.generation.num_replicas}
        how = {"replicas": "prepare's GeneratorActor replicas, booted once, vllm.LLM in-process",
               "ray-data": "ray.data.llm vLLMEngineProcessorConfig, engines started per round"}
        write(a.json, result, provenance(argv, target=target.path),
              {side: {"engine": how[side], **shared} for side in SIDES},
              compared=("engine",), shared=tuple(shared))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
