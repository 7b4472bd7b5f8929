"""Each stage against its limit, measured side by side in one run on a real target (default
target=smollm2): what the stage achieves beside what the machine does bare, and the thread and
replica settings that use the machine.

    eyas bench limits OUT_DIR [--requests 128] [--steps 16] [--json PATH] [overrides ...]

OUT_DIR (new) gets a small run of the pipeline (prepare with the target regenerating the
answers, extract); then, one after the other in this process:

  regeneration  the same greedy requests answered by vLLM replicas in Ray actors (prepare's own
                actors) at each (replicas, torch threads per replica): answers/s, tokens/s
  extraction    the extract stage's tokens/s against a bare forward of the target over the same
                batches (interleaved, best of two; goal >= 0.9), and the Ray stage's own figure
  serving       vLLM without a draft at 1 and at every core's threads: ms per token at
                concurrency 1, tokens/s with 4 requests at once
  training      eyas's trainer against speculators' and SpecForge's on the same batches
                (bench/peer_speed.py; goal >= 1.3x)

--json writes the table and its record (bench/record.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from eyas.run_records import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # record, extract_bench, peer_speed

ROOT = Path(__file__).resolve().parent.parent
CORES = len(os.sched_getaffinity(0))


def _prompts(cfg, tokenizer, n: int) -> list[list[int]]:
    """The first user turn of the demo's train conversations, as regeneration asks it."""
    from eyas.conversations.prepare import demo_conversations

    train, _ = demo_conversations(cfg.data.demo)
    out = []
    for messages in train[:n]:
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        text = tokenizer.apply_chat_template(messages[:first], tokenize=False,
                                             add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def regeneration(overrides, target_dir, prompts) -> list[dict]:
    import ray

    from tasks.prepare import _complete_on, _generators, replica_threads
    from workflows.config import load_config

    rows = []
    # None: eyas's own choice of threads (tasks/prepare.py replica_threads)
    for replicas, threads in ((1, 1), (1, CORES), (2, CORES), (2, None)):
        cfg = load_config([*overrides, f"data.generation.num_replicas={replicas}",
                           f"serve.cpu_threads={'null' if threads is None else threads}"])
        chosen, threads = threads is None, replica_threads(cfg)
        started = time.perf_counter()
        actors = _generators(cfg, target_dir)
        ray.get([a.engine_version.remote() for a in actors])  # booted
        boot = time.perf_counter() - started
        complete = _complete_on(actors)
        # warm-up: every replica's first pass
        ray.get([a.complete.remote(prompts[:4], cfg.data.generation) for a in actors])
        started = time.perf_counter()
        answers = complete(prompts, cfg.data.generation)
        seconds = time.perf_counter() - started
        for actor in actors:
            ray.kill(actor)
        tokens = sum(len(ids) for ids, _ in answers)
        rows.append({"replicas": replicas, "threads_per_replica": threads, "eyas_default": chosen,
                     "answers": len(answers), "tokens": tokens, "seconds": seconds,
                     "answers_per_s": len(answers) / seconds, "tokens_per_s": tokens / seconds,
                     "boot_s": boot})
        print(f"regeneration: {replicas} replica(s) x {threads} thread(s): "
              f"{len(answers) / seconds:.2f} answers/s, {tokens / seconds:.0f} tokens/s "
              f"(boot {boot:.0f} s)", flush=True)
    return rows


def serving(target_dir, prompts, dtype: str, order=None) -> list[dict]:
    """vLLM without a draft booted with each torch thread count of `order` in turn (default 1,
    then every core): ms per token at concurrency 1 over 4 prompts x 64 tokens, tokens/s with
    the 4 at once."""
    from eyas.engines.vllm_engine import EngineOptions, VllmEngine

    four = prompts[:4]
    rows = []
    for threads in order or sorted({1, CORES}):
        options = EngineOptions(dtype=dtype, torch_threads=threads, max_num_seqs=4,
                                max_model_len=-(-(max(map(len, four)) + 64) // 256) * 256)
        with VllmEngine(target_dir, None, 0, options) as engine:
            engine.generate(four[:1], 8)  # warm-up
            one = [engine.generate([p], 64) for p in four]
            per = sum(r.wall_s for r in one) / sum(r.output_tokens for r in one)
            together = engine.generate(four, 64)
            rows.append({"threads": threads, "ms_per_token_c1": per * 1000,
                         "tokens_per_s_c4": together.tokens_per_s, "boot_s": engine.boot_s,
                         "engine": together.engine_version})
        print(f"serving: {threads} thread(s): {per * 1000:.1f} ms/token at concurrency 1, "
              f"{together.tokens_per_s:.0f} tokens/s with 4 at once", flush=True)
    return rows


def _stage_figures(run: Path) -> dict:
    """The extract stage's own figures (its MLflow metrics): wall time from its start to its
    manifest, the replicas' start and the probe set included, against its bare forward."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    found = [r for e in client.search_experiments() for r in client.search_runs(
        [e.experiment_id], "metrics.bare_forward_tokens_per_s > 0")]
    if not found:
        return {}
    m = found[0].data.metrics
    return {"stage_tokens_per_s": m["tokens_per_s"],
            "stage_bare_tokens_per_s": m["bare_forward_tokens_per_s"]}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--json", type=Path)
    a, overrides = p.parse_known_args(argv)
    overrides = ["target=smollm2", *overrides]
    out = a.out_dir.resolve()
    if out.exists():
        raise SystemExit(f"{out} exists: name a new directory (nothing is overwritten)")

    import ray

    import extract_bench
    import peer_speed
    from eyas.targets import load_tokenizer
    from workflows import pipeline
    from workflows.config import load_config

    run = out / "run"
    ray.init(log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    started = time.perf_counter()
    code = pipeline.main([*overrides, f"run_dir={run}", "stages=[prepare,extract]",
                          f"data.demo.num_train={a.requests}", "data.demo.num_heldout=16",
                          "mlflow.run_name=limits"])
    if code:
        raise SystemExit(f"the run in {run} failed (exit {code})")
    print(f"prepare + extract: {time.perf_counter() - started:.0f} s", flush=True)
    from eyas.run_records import target_path
    target_dir = target_path(run)
    cfg = load_config([*overrides, f"data.demo.num_train={a.requests}"])
    tokenizer = load_tokenizer(target_dir)
    prompts = _prompts(cfg, tokenizer, a.requests)

    result = {"run": str(run), "cores": CORES, "requests": len(prompts)}
    result["regeneration"] = regeneration(overrides, target_dir, prompts)
    ray.shutdown()  # the stages below run in this process, on every core

    ext = extract_bench.side_by_side(load_config([*overrides, f"run_dir={run}"]),
                                     RunDir.of(run).prepare, out / "extract-bench", rounds=3)
    ext.update(_stage_figures(run))
    result["extraction"] = ext
    print(f"extraction: {ext['extract_tokens_per_s']:.0f} tokens/s against a bare forward's "
          f"{ext['bare_tokens_per_s']:.0f}: {1 / ext['time_ratio']:.3f} (goal >= 0.9); the Ray "
          f"stage: {ext.get('stage_tokens_per_s')} against {ext.get('stage_bare_tokens_per_s')}",
          flush=True)

    result["serving"] = serving(target_dir, prompts, cfg.target.dtype)
    result["training"] = peer_speed.main([str(run), "--steps", str(a.steps)])
    sys.path.insert(0, str(ROOT / "docs" / "scripts"))
    from tables import RENDER  # the docs' table, from the same dict
    print("\n" + RENDER["limits"]({"rows": result}), flush=True)
    if a.json:
        from record import provenance, write
        write(a.json, result, provenance(argv, target_dir),
              {"regeneration": {"requests": len(prompts), "max_new_tokens":
                                cfg.data.generation.max_new_tokens, "dtype": cfg.target.dtype},
               "serving": {"prompts": 4, "max_new_tokens": 64, "dtype": cfg.target.dtype},
               "extraction": {"dtype": ext["dtype"], "batches": "the same"},
               "training": {"steps": a.steps}},
              shared=())  # one measurement per stage: its sides are not compared
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
