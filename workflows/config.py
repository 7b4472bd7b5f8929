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

from eyas.config import STAGES, PipelineConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("target", "data", "extract", "draft", "train", "eval", "serve", "mlflow")
_CHOICES = {"data.on_bad_record": ("error", "skip"), "serve.engine": ("vllm", "reference"),
            "extract.backend": ("hf", "vllm")}


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
    obj.run_dir = str(Path(os.path.expanduser(obj.run_dir)).resolve())
    return obj


def _validate(cfg: PipelineConfig) -> None:
    for stage in cfg.stages:
        if stage not in STAGES:
            near = difflib.get_close_matches(stage, STAGES, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"stages: unknown stage {stage!r} (stages: {', '.join(STAGES)}){hint}")
    for key, allowed in _CHOICES.items():
        value = OmegaConf.select(OmegaConf.structured(cfg), key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: must be one of {', '.join(allowed)}")


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
