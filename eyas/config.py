"""Typed configuration: plain dataclasses, one per YAML group in `conf/`.

OmegaConf stays at the edge (`workflows/config.py` merges defaults, YAML and the command-line
dotlist into these); everything below the entry point receives these plain objects.
Defaults here are the structured schema; `conf/` holds the shipped choices.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# Stage order of the pipeline. A stage is run only when named in `stages` (or by default).
STAGES = ("prepare", "extract", "train", "evaluate", "serve")


@dataclass
class BuiltinTargetConfig:
    """The small Llama eyas builds from Python's standard-library sources (no hub needed)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 688
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    seq_len: int = 128
    batch_size: int = 16
    train_steps: int = 600
    lr: float = 3e-3
    warmup_steps: int = 30
    eval_tokens: int = 100_000  # held-out tokens scored for the report (model vs unigram)
    heldout_fraction: float = 0.05  # of standard-library files, by a hash of their path
    max_corpus_mb: float = 24.0  # cap on corpus bytes read (deterministic: sorted files)
    seed: int = 0
    cache_dir: str = "~/.cache/eyas/targets"


@dataclass
class TargetConfig:
    # A local HF causal-LM directory; when null, the built-in small target is built (cached).
    path: Optional[str] = None
    dtype: str = "float32"
    builtin: BuiltinTargetConfig = field(default_factory=BuiltinTargetConfig)


@dataclass
class DemoDataConfig:
    """"Continue this code" conversations cut from held-out standard-library files."""

    num_train: int = 512
    num_heldout: int = 64
    prompt_lines: int = 12
    completion_lines: int = 8
    multi_turn_fraction: float = 0.25
    seed: int = 0


@dataclass
class GenerationConfig:
    """How the target regenerates assistant turns (data.regenerate; eyas/data/regenerate.py)."""

    temperature: float = 0.0  # 0: greedy, what serving at temperature 0 continues
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0  # per-request seeds derive from it (sampling at temperature > 0)
    on_truncated: str = "drop"  # drop | keep: a turn stopped by max_new_tokens (counted either way)
    num_replicas: int = 1  # target replicas generating data-parallel (Ray actors)
    gpus_per_replica: int = 0  # >1: the replica's target is sharded over them (tensor parallel)


@dataclass
class DataConfig:
    # Conversation files (JSONL or Parquet, `messages` or ShareGPT `conversations`).
    # Empty lists: the built-in demo set.
    train_files: list[str] = field(default_factory=list)
    heldout_files: list[str] = field(default_factory=list)
    max_length: int = 512
    on_bad_record: str = "error"  # error | skip (skipped records are counted and logged)
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
    verifier: the target state the draft is trained to predict from (default: the last
      block's output before the final norm).
    """

    draft_inputs: Optional[list[str]] = None
    verifier: str = "final_prenorm"


@dataclass
class ExtractConfig:
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    backend: str = "hf"  # hf | vllm
    dtype: str = "bfloat16"
    samples_per_shard: int = 256
    batch_tokens: int = 8192  # padded tokens per forward batch
    num_replicas: int = 1
    gpus_per_replica: int = 0  # a replica spanning k GPUs runs as k pipeline stages, one each
    stages_per_replica: Optional[int] = None  # null: max(1, gpus_per_replica); >1 on CPU too
    probe_samples: int = 4


@dataclass
class DraftConfig:
    vocab_size: int = 2048  # reduced draft vocabulary (most frequent loss-masked tokens)
    # Overrides of the hyper-parameters taken from the target (null = the target's).
    hidden_size: Optional[int] = None
    num_heads: Optional[int] = None
    intermediate_size: Optional[int] = None
    # vLLM's llama_eagle3 normalisation options (eyas/draft/model.py says what each computes),
    # written into the draft's config.json so the engine serves what was trained. Defaults
    # chosen by bench/recipe_bench.py (README: "The draft recipe"); SGLang applies no
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
    queue_steps: int = 4
    # later epochs reuse the first epoch's states, held in the object store (spilled to disk
    # by Ray when they do not fit) instead of re-running the target
    keep_epoch: bool = False


# train.ttt_scheme and train.loss: the values eyas/draft/ttt.py implements
TTT_SCHEMES = ("inference", "specforge")
TRAIN_LOSSES = ("kl", "ce")


@dataclass
class TrainConfig:
    # offline: train on run_dir/extract's stored shards | online: states streamed from the
    # target while training, nothing stored but the probe set (train.online)
    source: str = "offline"
    online: OnlineConfig = field(default_factory=OnlineConfig)
    num_workers: int = 1
    ttt_steps: int = 7
    epochs: int = 2
    batch_size: int = 8
    lr: float = 3e-4
    step_loss_decay: float = 0.8  # weight of TTT step k is decay**k
    adam_beta2: float = 0.999  # measured against 0.95 by bench/recipe_bench.py
    freeze_lm_head: bool = False  # keep lm_head at the target's rows for the draft vocab
    # lm_head starts from: target (the target's rows for the draft vocab) | random (torch's
    # default init, seeded by train.seed)
    lm_head_init: str = "target"
    # how the training-time test unrolls: inference (row r of step k at position r+k, seeing
    # step 0's rows <= r: what vLLM computes when it drafts) | specforge (positions fixed,
    # step 0's rows r-k+1..r hidden: SpecForge's and EAGLE's scheme)
    ttt_scheme: str = "inference"
    # rows in the loss: assistant (the loss mask) | all (every real token, the prompt's too;
    # the accuracy recorded while training still counts the assistant tokens)
    loss_tokens: str = "assistant"
    # loss per scored row: ce (cross-entropy on the target's greedy token in the draft vocab;
    # bench/recipe_bench.py: served tau 2.38 against kl's 2.04) | kl (to the target's
    # distribution over the draft vocab)
    loss: str = "ce"
    checkpoint_every: int = 200
    seed: int = 0


@dataclass
class EvalConfig:
    # draft positions (k) scored and predicted tau is computed at; null: serve's k
    # (serve.num_speculative_tokens). A different explicit value is refused: predicted and
    # served tau would be compared at two k.
    steps: Optional[int] = None
    gap_tolerance: float = 0.05
    # training samples the draft is re-scored on standalone (the gap check); null: all. In an
    # online run the target recomputes them, so a large online run sets a cap
    max_train_samples: Optional[int] = None
    num_prompts: int = 16
    max_new_tokens: int = 64


@dataclass
class ServeConfig:
    engine: str = "vllm"  # vllm | reference
    draft: Optional[str] = None  # serve any draft directory instead of the trained one
    num_speculative_tokens: int = 3
    num_prompts: int = 8
    max_new_tokens: int = 64
    # requests in flight at once; 1 (one request at a time, what latency is bought for) is
    # always measured and is the headline; the others add a sweep (vLLM only)
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16])
    force: bool = False


@dataclass
class MlflowConfig:
    # null: a sqlite store under the run directory, created by the driver before any worker.
    tracking_uri: Optional[str] = None
    experiment: str = "eyas"
    run_name: Optional[str] = None


@dataclass
class PipelineConfig:
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    run_dir: str = "runs/default"
    seed: int = 0
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
