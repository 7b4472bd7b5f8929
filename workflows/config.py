"""Config composition at the edge: structured defaults <- conf/ YAML <- command-line dotlist.

    python -m workflows.pipeline stages=[prepare] run_dir=/tmp/run target.builtin.train_steps=50
    python -m workflows.pipeline target=local target.path=/models/llama

`GROUP=CHOICE` (GROUP one of conf/'s folders) picks conf/GROUP/CHOICE.yaml, merged over that
section's schema defaults (a `GLOBAL_HEADER` preset, such as a target's, may set any section,
and is merged first); `experiment=NAME` merges conf/experiment/NAME.yaml over everything (its
`defaults:` may choose groups, as conf/config.yaml's do; a group on the command line wins); any
other `a.b.c=value` sets one key. A misspelled key or a wrong type is an error naming the key,
where it came from, and the nearest valid key; a value outside what its field declares
(eyas/config.py: `choice`, `ranged`) is refused here too. Everything after this module sees a
plain `PipelineConfig` dataclass, and workflows/plan.py's `preflight` resolves it against the
target's shape into the run's `RunPlan`.
"""
from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import fields, is_dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from eyas.config import PipelineConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("target", "data", "extract", "draft", "train", "eval", "serve", "mlflow")
# a preset whose first line is this sets keys of any section, not only its group's: a target
# preset states what that target needs of the other stages too (the layout, the rate)
GLOBAL_HEADER = "# @package _global_"


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
    parent, _, leaf = key.rpartition(".")
    # the same name in another section first: seed -> train.seed, extract.lr -> train.lr
    same_leaf = [c for c in candidates if c.rpartition(".")[2] == leaf]
    close = difflib.get_close_matches(key, same_leaf, n=1, cutoff=0) or \
        difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    if not close:  # compare the last component among siblings
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
    except TypeError as e:  # a mapping where the schema holds a list, or the reverse
        raise ConfigError(f"{source}: bad value ({e}): a section takes key: value pairs, a "
                          "list takes [a, b], any other key one plain value") from None


def _short_tag(tag: str) -> str:
    return "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag


def _check_plain(text: str, where: str, prefix: str = "") -> None:
    """Refuse YAML beyond what a config holds: plain scalars, lists, and key: value sections.
    A tag (!!python/object/apply:..., !!binary, even !!str), an anchor or an alias is refused
    naming the key, before anything is constructed from the text (so nothing is executed).
    `where` names the override or file; `prefix` the override's key."""
    stack: list[list] = []  # [kind ("map"/"seq"), current key or index, expecting a key]

    def key_path() -> str:
        parts = [prefix] if prefix else []
        for kind, k, expecting_key in stack:
            if kind == "seq":
                parts[-1:] = [f"{parts[-1] if parts else ''}[{k}]"]
            elif not expecting_key and k is not None:
                parts.append(str(k))
        return ".".join(parts) or "the top level"

    def refuse(event, what: str) -> None:
        line = f", line {event.start_mark.line + 1}" if not prefix else ""
        raise ConfigError(f"{key_path()}: {what} ({where}{line}); config values are plain "
                          "numbers, strings and lists: remove it (quote a value meant as text)")

    def value_done() -> None:
        if stack:
            top = stack[-1]
            if top[0] == "map":
                top[2] = True
            else:
                top[1] += 1
    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if not isinstance(ev, yaml.NodeEvent):
                if isinstance(ev, yaml.CollectionEndEvent):
                    stack.pop()
                    value_done()
                continue
            if isinstance(ev, yaml.AliasEvent):
                refuse(ev, f"the YAML alias *{ev.anchor} is not allowed")
            if getattr(ev, "tag", None) not in (None, "!"):
                refuse(ev, f"the YAML tag {_short_tag(ev.tag)} is not allowed")
            if ev.anchor:
                refuse(ev, f"the YAML anchor &{ev.anchor} is not allowed")
            top = stack[-1] if stack else None
            if top and top[0] == "map" and top[2]:  # a key
                if not isinstance(ev, yaml.ScalarEvent):
                    refuse(ev, "a key that is not a plain name is not allowed")
                top[1], top[2] = ev.value, False
            elif isinstance(ev, yaml.SequenceStartEvent):
                stack.append(["seq", 0, None])
            elif isinstance(ev, yaml.MappingStartEvent):
                stack.append(["map", None, True])
            else:
                value_done()
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(e).split())})") from None


def _load_yaml(path: Path):
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path}: cannot read it ({e})") from None
    _check_plain(text, str(path))
    try:
        return OmegaConf.create(text) if text.strip() else OmegaConf.create({})
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
            _check_plain(value, f"override {item!r}", key)
            dotlist.append(f"{key}={value}")

    experiment_node = None
    if experiment:
        path = conf_dir / "experiment" / f"{experiment}.yaml"
        if not path.exists():
            raise ConfigError(f"experiment={experiment}: no {path}; experiments: "
                              f"{', '.join(_options('experiment', conf_dir))}")
        experiment_node = _load_yaml(path)
        # an experiment may choose groups (`defaults: {target: smollm2}`); one named on the
        # command line wins
        picked = dict(experiment_node.pop("defaults", {}) or {})
        named = {item.partition("=")[0].strip().lstrip("+") for item in overrides}
        for group, choice in picked.items():
            if group not in GROUPS or choice not in _options(group, conf_dir):
                raise ConfigError(f"{path}: defaults {group}={choice}: no conf/{group}/"
                                  f"{choice}.yaml (groups: {', '.join(GROUPS)})")
            if group not in named:
                choices[group] = choice
    cfg = _merge(schema, top, str(conf_dir / "config.yaml"), schema)
    required: dict[str, str] = {}
    presets = []
    for group, choice in choices.items():
        if group not in GROUPS:
            raise ConfigError(f"{conf_dir / 'config.yaml'}: unknown group {group!r} in defaults; "
                              f"groups: {', '.join(GROUPS)}")
        path = conf_dir / group / f"{choice}.yaml"
        node = _load_yaml(path)
        is_global = path.read_text().startswith(GLOBAL_HEADER)
        presets.append((not is_global, group, choice, path, node if is_global else {group: node}))
    # global presets first: a group chosen after them starts its section afresh from the
    # schema's defaults (extract=default drops the layout target=builtin names)
    for group_only, group, choice, path, node in sorted(presets, key=lambda p: p[0]):
        if group_only:
            cfg = _merge(cfg, {group: schema[group]}, str(path), schema)
        required.update({k: f"{group}={choice}" for k in _required(OmegaConf.create(node))})
        cfg = _merge(cfg, node, str(path), schema)
    if experiment_node is not None:
        path = conf_dir / "experiment" / f"{experiment}.yaml"
        for key in _all_keys(experiment_node):
            required.pop(key, None)
        cfg = _merge(cfg, experiment_node, str(path), schema)
    for item in dotlist:
        required.pop(item.partition("=")[0], None)
        cfg = _merge(cfg, OmegaConf.from_dotlist([item]), f"override {item!r}", schema)
    if required:
        key, why = sorted(required.items())[0]
        raise ConfigError(f"{why} needs {key}: set it on the command line, e.g. {key}=...")
    return cfg


def usage(prog: str = "python -m workflows.pipeline") -> str:
    """The pipeline's --help: the groups and their choices, how keys are set."""
    choices = {g: ", ".join(sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")))
               for g in (*GROUPS, "experiment")}
    groups = "\n".join(f"  {g + '=':<12}{c}" for g, c in choices.items())
    return f"""usage: {prog} [GROUP=CHOICE ...] [key=value ...] [--debug]

Runs the pipeline's stages (prepare, extract, train, evaluate, serve) into run_dir; a rerun
skips what is done. GROUP=CHOICE picks conf/GROUP/CHOICE.yaml:
{groups}
key=value sets one key, e.g. run_dir=runs/demo train.lr=1e-3 stages=[prepare,extract]
(every key, its default and allowed values: docs/configuration.md).
--debug (or debug=true): tracebacks, and vLLM's and Ray's own logs.
Exit 0: done; 2: bad input (config, data, files); 1: a check failed (doctor, parity)."""


def load_config(overrides: list[str] | tuple[str, ...] = (), conf_dir: Path = CONF_DIR,
                ) -> PipelineConfig:
    cfg = compose(overrides, conf_dir)
    try:
        obj: PipelineConfig = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"config: {e}") from None
    _validate(obj)
    obj.run_dir = str(Path(os.path.expanduser(obj.run_dir)).resolve())
    # Ray jobs run in a copy of the working directory: files are named absolutely
    from eyas.conversations.prompt_sets import is_builtin
    obj.serve.prompt_sets = {name: path if is_builtin(path) else
                             str(Path(os.path.expanduser(path)).resolve())
                             for name, path in obj.serve.prompt_sets.items()}
    return obj


def _validate(cfg: PipelineConfig) -> None:
    _check_declared(cfg)
    _check_related(cfg)
    _resolve(cfg)
    _check_served(cfg)


def registered_choices(f) -> tuple[str, ...]:
    """The choices of a key declared `registered` (eyas.config): its registry's names."""
    module, _, names = f.metadata["registry"].partition(":")
    return tuple(getattr(importlib.import_module(module), names))


def _check_declared(node, prefix: str = "") -> None:
    """Each key against the allowed values or range its field declares (eyas/config.py).
    Checked before any stage starts, so a typo never reaches (or clears) finished work."""
    for f in fields(node):
        key, value = f"{prefix}{f.name}", getattr(node, f.name)
        if is_dataclass(value):
            _check_declared(value, f"{key}.")
        elif "choices" in f.metadata and value not in f.metadata["choices"]:
            raise ConfigError(f"{key}={value!r}: must be one of {', '.join(map(str, f.metadata['choices']))}")
        elif "registry" in f.metadata and value not in (names := registered_choices(f)):
            raise ConfigError(f"{key}={value!r}: must be one of {', '.join(names)}")
        elif "range" in f.metadata and value is not None and not f.metadata["range"].admits(value):
            raise ConfigError(f"{key}={value!r}: must be {f.metadata['range']}")
        elif "each_choices" in f.metadata:
            allowed = f.metadata["each_choices"]
            for item in value:
                if item not in allowed:
                    near = difflib.get_close_matches(item, allowed, n=1)
                    hint = f"; did you mean {near[0]!r}?" if near else ""
                    raise ConfigError(f"{key}: unknown item {item!r} (allowed: "
                                      f"{', '.join(allowed)}){hint}")
        elif "each_range" in f.metadata:
            low = f.metadata["each_range"]
            if not value or not all(low.admits(item) for item in value):
                raise ConfigError(f"{key}={list(value)}: each item must be {low} "
                                  f"({f.metadata['why']}), and at least one given")


def _check_related(cfg: PipelineConfig) -> None:
    """Keys that are valid alone but not together."""
    b = cfg.target.builtin
    if cfg.target.path and cfg.target.packaged:
        raise ConfigError(f"target.path={cfg.target.path} and target.packaged="
                          f"{cfg.target.packaged}: name one target (target=local or "
                          f"target={cfg.target.packaged})")
    if not cfg.target.path and not cfg.target.packaged:
        if b.hidden_size % b.num_heads:
            raise ConfigError(f"target.builtin.hidden_size={b.hidden_size} is not divisible by "
                              f"target.builtin.num_heads={b.num_heads}")
        if b.num_heads % b.num_kv_heads:
            raise ConfigError(f"target.builtin.num_heads={b.num_heads} is not divisible by "
                              f"target.builtin.num_kv_heads={b.num_kv_heads}")


def _resolve(cfg: PipelineConfig) -> None:
    """The keys left unset that the rest decides, resolved here so the run's recorded config
    states them; the draft family's cross-key rules decide its own."""
    from eyas import precision
    from eyas.draft.families import get as get_family

    if cfg.target.dtype == precision.AUTO:  # the machine the run starts on decides
        cfg.target.dtype = precision.pick(precision.AUTO, target_bf16(cfg))
    if cfg.serve.dtype is None:
        cfg.serve.dtype = cfg.target.dtype
    if cfg.data.demo.source is None:
        pretrained = bool(cfg.target.path or cfg.target.packaged)
        cfg.data.demo.source = "docstrings" if pretrained else "code"
    d = cfg.draft
    try:
        resolved = get_family(d.family).resolve(d, cfg.train, cfg.serve.num_speculative_tokens,
                                                cfg.serve.draft is not None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for key, value in resolved.items():
        setattr(d, key, value)


def _check_served(cfg: PipelineConfig) -> None:
    """The draft the serve stage would serve (the trained one's draft.family, or serve.draft's
    kind as its config reads), refused before any stage where vLLM cannot serve it on this
    machine (vLLM itself refuses only when it boots, after extraction and training): the
    runner vLLM picks here (eyas.conventions.rules.vllm_runner: the CPU build's V1; a GPU's V2
    unless VLLM_USE_V2_MODEL_RUNNER says otherwise), on the device the serve stage finds (CUDA
    or not), against the block kinds a runner lacks (eyas.conventions.vllm_dflash.
    not_served_by: DSpark is V2's only)."""
    from eyas.conventions.engines import engine_rules

    if "serve" not in cfg.stages or not engine_rules(cfg.serve.engine).boots_vllm:
        return
    import torch

    from eyas.conventions.kinds import draft_kind
    from eyas.conventions.rules import vllm_runner
    from eyas.conventions.vllm_dflash import not_served_by
    from eyas.draft.directory import read_config
    from eyas.draft.families import get as get_family

    if cfg.serve.draft is None:
        kind, what = get_family(cfg.draft.family).kind, f"draft.family={cfg.draft.family}"
    else:
        try:
            kind = draft_kind(read_config(Path(cfg.serve.draft).expanduser()))
        except (OSError, ValueError):  # the serve stage says what is wrong with it
            return
        what = f"serve.draft={cfg.serve.draft} (a {kind.name} draft)"
    gpu = torch.cuda.is_available()
    runner, why = vllm_runner("cuda" if gpu else "cpu",
                              os.environ.get("VLLM_USE_V2_MODEL_RUNNER") if gpu else None)
    refused = not_served_by(kind.name, runner.name)
    if refused is None:
        return
    rest = [s for s in cfg.stages if s != "serve"] or ["prepare", "extract", "train", "evaluate"]
    raise ConfigError(
        f"{what} with the serve stage (serve.engine={cfg.serve.engine}): {refused}, and vLLM "
        f"runs its {runner.name} runner here ({why}), so serving would fail after the stages "
        f"before it. Drop serve from the stages ('stages=[{','.join(rest)}]': the draft is "
        f"trained, evaluated by eyas's own engine and exportable here), or run on a machine "
        f"with a GPU and the `vllm` extra"
        + (" with VLLM_USE_V2_MODEL_RUNNER unset" if gpu else ""))


def target_bf16(cfg: PipelineConfig):
    """Whether what runs the target computes bfloat16 natively (eyas.precision): its GPU
    replicas where it has them, else this machine's CPU."""
    from eyas import precision

    return precision.support(
        on_gpu=bool(cfg.extract.gpus_per_replica or cfg.data.generation.gpus_per_replica))


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
