"""Config composition at the edge: structured defaults <- conf/ YAML <- command-line dotlist.

    python -m workflows.pipeline stages=[prepare] run_dir=/tmp/run target.builtin.train_steps=50
    python -m workflows.pipeline extract=default target=local target.path=/models/llama

`GROUP=CHOICE` (GROUP one of conf/'s folders) picks conf/GROUP/CHOICE.yaml; `experiment=NAME`
merges conf/experiment/NAME.yaml over everything; any other `a.b.c=value` sets one key.
A misspelled key or a wrong type is an error naming the key, where it came from, and the
nearest valid key. Everything after this module sees a plain `PipelineConfig` dataclass.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from eyas.config import STAGES, TRAIN_LOSSES, TTT_SCHEMES, PipelineConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("target", "data", "extract", "draft", "train", "eval", "serve", "mlflow")
_DTYPES = ("float32", "bfloat16", "float16")
_CHOICES = {"data.on_bad_record": ("error", "skip"), "serve.engine": ("vllm", "reference"),
            "extract.backend": ("hf", "vllm"), "target.dtype": _DTYPES, "extract.dtype": _DTYPES,
            "train.loss_tokens": ("assistant", "all"), "train.source": ("offline", "online"),
            "train.lm_head_init": ("target", "random"),
            "train.ttt_scheme": TTT_SCHEMES, "train.loss": TRAIN_LOSSES,
            "data.generation.on_truncated": ("drop", "keep")}
# Numeric keys and the range each must lie in: (low, high, low inclusive); None = unbounded.
# Checked before any stage starts, so a typo never reaches (or clears) finished work.
_RANGES = {
    **{f"target.builtin.{k}": (1, None, True) for k in (
        "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
        "intermediate_size", "max_position_embeddings", "seq_len", "batch_size", "train_steps",
        "eval_tokens")},
    "target.builtin.rope_theta": (0, None, False), "target.builtin.lr": (0, None, False),
    "target.builtin.warmup_steps": (0, None, True),
    "target.builtin.heldout_fraction": (0, 1, False), "target.builtin.max_corpus_mb": (0, None, False),
    "data.max_length": (2, None, True),
    **{f"data.demo.{k}": (1, None, True) for k in (
        "num_train", "num_heldout", "prompt_lines", "completion_lines")},
    "data.demo.multi_turn_fraction": (0, 1, True),
    "data.generation.temperature": (0, None, True), "data.generation.top_p": (0, 1, False),
    "data.generation.max_new_tokens": (1, None, True),
    "data.generation.num_replicas": (1, None, True),
    "data.generation.gpus_per_replica": (0, None, True),
    "extract.samples_per_shard": (1, None, True), "extract.batch_tokens": (1, None, True),
    "extract.num_replicas": (1, None, True), "extract.gpus_per_replica": (0, None, True),
    "extract.stages_per_replica": (1, None, True), "extract.probe_samples": (0, None, True),
    "draft.vocab_size": (2, None, True), "draft.hidden_size": (1, None, True),
    "draft.num_heads": (1, None, True), "draft.intermediate_size": (1, None, True),
    "train.num_workers": (1, None, True), "train.ttt_steps": (1, None, True),
    "train.epochs": (1, None, True), "train.batch_size": (1, None, True),
    "train.lr": (0, None, False), "train.step_loss_decay": (0, 1, False),
    "train.checkpoint_every": (1, None, True), "train.online.queue_steps": (1, None, True),
    "eval.max_train_samples": (1, None, True),
    "eval.steps": (1, None, True), "eval.gap_tolerance": (0, 1, True),
    "eval.num_prompts": (1, None, True), "eval.max_new_tokens": (1, None, True),
    "serve.num_speculative_tokens": (1, None, True), "serve.num_prompts": (1, None, True),
    "serve.max_new_tokens": (1, None, True),
}


class ConfigError(ValueError):
    pass


def _all_keys(node, prefix="") -> list[str]:
    keys = []
    for k, v in node.items_ex(resolve=False) if isinstance(node, DictConfig) else []:
        path = f"{prefix}{k}"
        keys.append(path)
        if isinstance(v, DictConfig):
            keys.extend(_all_keys(v, path + "."))
    return keys


def _nearest(key: str, schema) -> str:
    candidates = _all_keys(schema)
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    if not close:  # compare the last component among siblings
        parent, _, leaf = key.rpartition(".")
        siblings = [c for c in candidates if c.rpartition(".")[0] == parent]
        close = [f"{parent}.{m}" if parent else m for m in difflib.get_close_matches(
            leaf, [s.rpartition(".")[2] for s in siblings], n=1, cutoff=0.3)]
    return f"; did you mean {close[0]!r}?" if close else ""


def _merge(base, update, source: str, schema):
    try:
        return OmegaConf.merge(base, update)
    except ConfigKeyError as e:
        key = e.full_key or str(e.key)
        raise ConfigError(f"{source}: unknown config key {key!r}{_nearest(key, schema)}") from None
    except ValidationError as e:
        raise ConfigError(f"{source}: bad value for {e.full_key!r}: "
                          f"{str(e.msg).splitlines()[0]}") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{source}: {e}") from None


def _load_yaml(path: Path):
    try:
        return OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except Exception as e:  # YAML syntax errors carry line numbers
        raise ConfigError(f"{path}: not valid YAML ({e})") from None


def _options(group: str, conf_dir: Path) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def _required(node, prefix="") -> set[str]:
    """Keys a YAML file marks `???`: merging would keep the default, so track them here."""
    out = set()
    for k in node.keys() if isinstance(node, DictConfig) else []:
        if OmegaConf.is_missing(node, k):
            out.add(f"{prefix}{k}")
        elif isinstance(node[k], DictConfig):
            out |= _required(node[k], f"{prefix}{k}.")
    return out


def compose(overrides: list[str] | tuple[str, ...] = (), conf_dir: Path = CONF_DIR) -> DictConfig:
    """Merge schema, conf/config.yaml, the chosen group files, an experiment and overrides."""
    schema = OmegaConf.structured(PipelineConfig)
    top = _load_yaml(conf_dir / "config.yaml")
    choices = dict(top.pop("defaults", {}) or {})
    experiment, dotlist = None, []
    for item in overrides:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("+")
        if not eq:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        if key in GROUPS and not value.strip().startswith(("{", "[")):
            if value not in _options(key, conf_dir):
                raise ConfigError(
                    f"override {item!r}: no conf/{key}/{value}.yaml; choices for {key}: "
                    f"{', '.join(_options(key, conf_dir))} (to set one key use {key}.KEY=VALUE)")
            choices[key] = value
        elif key == "experiment":
            experiment = value
        else:
            dotlist.append(f"{key}={value}")

    cfg = _merge(schema, top, str(conf_dir / "config.yaml"), schema)
    required: dict[str, str] = {}
    for group, choice in choices.items():
        if group not in GROUPS:
            raise ConfigError(f"{conf_dir / 'config.yaml'}: unknown group {group!r} in defaults; "
                              f"groups: {', '.join(GROUPS)}")
        path = conf_dir / group / f"{choice}.yaml"
        node = _load_yaml(path)
        required.update({k: f"{group}={choice}" for k in _required(OmegaConf.create({group: node}))})
        cfg = _merge(cfg, {group: node}, str(path), schema)
    if experiment:
        path = conf_dir / "experiment" / f"{experiment}.yaml"
        if not path.exists():
            raise ConfigError(f"experiment={experiment}: no {path}; experiments: "
                              f"{', '.join(_options('experiment', conf_dir))}")
        node = _load_yaml(path)
        for key in _all_keys(node):
            required.pop(key, None)
        cfg = _merge(cfg, node, str(path), schema)
    for item in dotlist:
        required.pop(item.partition("=")[0], None)
        cfg = _merge(cfg, OmegaConf.from_dotlist([item]), f"override {item!r}", schema)
    if required:
        key, why = sorted(required.items())[0]
        raise ConfigError(f"{why} needs {key}: set it on the command line, e.g. {key}=...")
    return cfg


def load_config(overrides: list[str] | tuple[str, ...] = (), conf_dir: Path = CONF_DIR,
                ) -> PipelineConfig:
    cfg = compose(overrides, conf_dir)
    try:
        obj: PipelineConfig = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"config: {e}") from None
    _validate(obj)
    obj.eval.steps = obj.serve.num_speculative_tokens  # one k per run (_check_related)
    obj.run_dir = str(Path(os.path.expanduser(obj.run_dir)).resolve())
    return obj


def _validate(cfg: PipelineConfig) -> None:
    for stage in cfg.stages:
        if stage not in STAGES:
            near = difflib.get_close_matches(stage, STAGES, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"stages: unknown stage {stage!r} (stages: {', '.join(STAGES)}){hint}")
    node = OmegaConf.structured(cfg)
    for key, allowed in _CHOICES.items():
        value = OmegaConf.select(node, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: must be one of {', '.join(allowed)}")
    for key, (low, high, closed) in _RANGES.items():
        value = OmegaConf.select(node, key)
        if value is None:  # optional keys: null means "the default"
            continue
        too_low = value < low if closed else value <= low
        if too_low or (high is not None and value > high):
            bound = (f"{'>=' if closed else '>'} {low}" if high is None else
                     f"in {'[' if closed else '('}{low}, {high}]")
            raise ConfigError(f"{key}={value!r}: must be {bound}")
    _check_related(cfg)


def _check_related(cfg: PipelineConfig) -> None:
    """Keys that are valid alone but not together."""
    b = cfg.target.builtin
    if not cfg.target.path:
        if b.hidden_size % b.num_heads:
            raise ConfigError(f"target.builtin.hidden_size={b.hidden_size} is not divisible by "
                              f"target.builtin.num_heads={b.num_heads}")
        if b.num_heads % b.num_kv_heads:
            raise ConfigError(f"target.builtin.num_heads={b.num_heads} is not divisible by "
                              f"target.builtin.num_kv_heads={b.num_kv_heads}")
    bad = [c for c in cfg.serve.concurrency if c < 1]
    if bad or not cfg.serve.concurrency:
        raise ConfigError(f"serve.concurrency={list(cfg.serve.concurrency)}: each level must be "
                          ">= 1 (requests in flight at once), e.g. [1, 4, 16]")
    if not 0 <= cfg.train.adam_beta2 < 1:
        raise ConfigError(f"train.adam_beta2={cfg.train.adam_beta2!r}: must be in [0, 1)")
    k, ttt = cfg.serve.num_speculative_tokens, cfg.train.ttt_steps
    if cfg.serve.draft is None and k > ttt:
        raise ConfigError(
            f"serve.num_speculative_tokens={k} exceeds train.ttt_steps={ttt}: the draft is "
            f"trained to propose {ttt} tokens in a row, and past that its proposals are rarely "
            f"accepted; set serve.num_speculative_tokens<={ttt} (or train.ttt_steps>={k})")
    if cfg.eval.steps is not None and cfg.eval.steps != k:
        raise ConfigError(
            f"eval.steps={cfg.eval.steps} differs from serve.num_speculative_tokens={k}: the "
            "evaluate stage would predict tau at another k than the one served, and the two "
            f"could not be compared; leave eval.steps unset (it follows serve's k) or set both")


def target_shape(cfg: PipelineConfig):
    """The target's architecture, depth and width, read without loading it (the built-in
    target from its config; a local one from its config.json), for checks before any stage."""
    from eyas.layout import TargetIdentity
    from eyas.target import TargetError, read_shape

    if cfg.target.path is None:
        b = cfg.target.builtin
        return TargetIdentity("LlamaForCausalLM", b.num_layers, b.hidden_size)
    try:
        return read_shape(Path(cfg.target.path).expanduser())
    except TargetError as e:
        raise ConfigError(str(e)) from None


def preflight(cfg: PipelineConfig) -> None:
    """What needs the target's shape, checked before any stage starts: the layout's slots
    (a typo such as block_out:9 on a 4-block target must not cost a finished extraction)."""
    from eyas.engines import vllm
    from eyas.layout import LayoutError

    if not any(s in cfg.stages for s in ("extract", "train", "evaluate", "serve")):
        return
    shape = target_shape(cfg)
    try:
        layout = vllm.layout_from_config(shape, cfg.extract.layout.draft_inputs,
                                         cfg.extract.layout.verifier)
        if cfg.extract.backend == "vllm":
            vllm.to_ids(layout)
    except LayoutError as e:
        lay = cfg.extract.layout
        raise ConfigError(f"extract.layout.draft_inputs={lay.draft_inputs}, "
                          f"extract.layout.verifier={lay.verifier!r}: {e}") from None
    from eyas.extract import stage_count

    stages = stage_count(cfg.extract)
    if stages > shape.num_layers:
        raise ConfigError(f"extract.stages_per_replica={stages}: the target has only "
                          f"{shape.num_layers} decoder blocks to split")


def to_yaml(cfg: PipelineConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def flatten(cfg: PipelineConfig) -> dict[str, str]:
    """Dotted keys -> string values (MLflow params)."""
    out = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = str(v)
    walk(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True), "")
    return out
