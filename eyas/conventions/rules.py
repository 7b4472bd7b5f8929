"""Where each engine, version and runner reads a draft's target-layer ids, and what it adds to
them: the engine rule as data. Each runner lists the config keys it tries, in its order; each
key names the engine source it was read from (docs/engines.md, "Which key, which runner").

A capture index is the residual-stream position vLLM's ids name: 0 = the embedding output,
k = the output of block k-1 (the input of block k), N = the last block's output before the
final norm (eyas.layout.Slot.at_stream_index). `shift` turns a key's ids into capture indices;
SGLang's EAGLE-3 ids go through its per-family rule instead (eyas.conventions.sglang.from_ids).

vLLM 0.32 has two model runners, with different key lists (`vllm_runner` says which one a
deployment gets). Worked example, a 61-layer DeepSeek-V3 target and SpecForge's config with ids
only under eagle_config, [1, 29, 57]:
  V1 (CPU build; GPU with parallel_drafting or VLLM_USE_V2_MODEL_RUNNER=0) -> eagle_config's
     [1, 29, 57]
  V2 (a CUDA GPU's default) -> no key it reads: the target's default (2, 30, 58)
"""
from __future__ import annotations

from dataclasses import dataclass

from eyas.conventions.vllm import AUX_IDS_KEY

DFLASH_IDS_PATH = "dflash_config.target_layer_ids"  # where DFlash drafts write their ids
# eagle_config's ids as each trainer's users write them (the doctor's --trainer), to stream
# indices: vLLM's convention is the input of layer k, SpecForge's and TorchSpec's its output
TRAINER_ID_SHIFT = {"vllm": 0, "specforge": 1}
_V1 = "vllm/v1/worker/gpu_model_runner.py `_get_eagle3_aux_layers_from_config`"
_V2 = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py `get_eagle3_aux_layers_from_config`"


@dataclass(frozen=True)
class Key:
    path: str  # dotted path in the draft's config.json
    shift: int | None  # capture index = id + shift; None: the target family's rule (SGLang)
    source: str  # file, line and function in the engine's source
    raw_for: tuple[str, ...] = ()  # draft model_types read without the shift
    # keys whose ids this one replaces whenever its parent dict is there, even with none
    replaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class Runner:
    engine: str  # "vllm" | "sglang"
    version: str
    name: str  # "V1" | "V2" | "" (SGLang has one)
    keys: tuple[Key, ...]
    default: str  # what is captured when no key gives ids, and where that is read

    @property
    def label(self) -> str:
        engine = {"vllm": "vLLM", "sglang": "SGLang"}[self.engine]
        return f"{engine} {self.version}" + (f" {self.name} runner" if self.name else "")

    @property
    def id(self) -> str:
        """'vllm:0.32:v1', as --engine takes it."""
        return ":".join(p for p in (self.engine, self.version, self.name.lower()) if p)


VLLM_V1 = Runner("vllm", "0.32", "V1", (
    Key(AUX_IDS_KEY, 0, f"{_V1}, gpu_model_runner.py:5268"),
    Key(DFLASH_IDS_PATH, 1, f"{_V1}, gpu_model_runner.py:5273-5277"),
    Key(f"eagle_config.{AUX_IDS_KEY}", 0, f"{_V1}, gpu_model_runner.py:5279-5280",
        replaces=(DFLASH_IDS_PATH,)),
), "the target model's get_eagle3_default_aux_hidden_state_layers (2, N//2, N-3) "
   "(model_executor/models/interfaces.py:1712), gpu_model_runner.py:5247")
VLLM_V2 = Runner("vllm", "0.32", "V2", (
    Key(AUX_IDS_KEY, 0, f"{_V2}, eagle3_utils.py:106"),
    Key(DFLASH_IDS_PATH, 1, f"{_V2}, eagle3_utils.py:108-111"),
    Key("dspark_target_layer_ids", 1, f"{_V2}, eagle3_utils.py:113-122",
        raw_for=("deepseek_v41",)),
    Key("target_layer_ids", 1, f"{_V2}, eagle3_utils.py:123-127"),
    Key("dflash_config.layer_ids", 0, f"{_V2}, eagle3_utils.py:128-133"),
    Key("eagle_config.layer_ids", 0, f"{_V2}, eagle3_utils.py:128-133"),
), "the target model's get_eagle3_default_aux_hidden_state_layers (2, N//2, N-3) "
   "(model_executor/models/interfaces.py:1712), eagle3_utils.py:29")
SGLANG = Runner("sglang", "0.5.23", "", (
    Key(f"eagle_config.{AUX_IDS_KEY}", None, "sglang/srt/models/llama_eagle3.py and the "
        "target's set_eagle3_layers_to_capture (models/llama.py, models/deepseek_v2.py)"),
), "the target's default [2, N//2, N-3] used raw (models/llama.py "
   "set_eagle3_layers_to_capture)")

VLLM_RUNNERS = (VLLM_V1, VLLM_V2)
RUNNERS = (VLLM_V1, VLLM_V2, SGLANG)
# every dotted path under which some runner reads a draft's ids
ID_PATHS = tuple(sorted({key.path for runner in RUNNERS for key in runner.keys}))


def value_at(config: dict, path: str):
    """The value at a dotted path of a config dict (None where a part is missing)."""
    node = config
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _parent_is_dict(config: dict, path: str) -> bool:
    """The key's parent is a non-empty dict (vLLM tests `if eagle_config and isinstance(...)`)."""
    parent = path.rpartition(".")[0]
    node = value_at(config, parent) if parent else config
    return bool(node) and isinstance(node, dict)


@dataclass(frozen=True)
class IdRead:
    """What one runner reads from a draft config."""

    runner: Runner
    key: Key | None  # where the ids came from; None: no key gave any, so the default
    written: list[int] | None  # the ids as written under `key`
    capture: list[int] | None  # capture indices; None: SGLang's family rule, or the default

    @property
    def where(self) -> str:
        if self.key is None:
            return f"no key it reads gives ids, so {self.runner.default}"
        shift = (f", +{self.key.shift}" if self.key.shift else ", as written"
                 ) if self.key.shift is not None else ""
        return f"{self.key.path}{shift} ({self.key.source})"


def read_ids(runner: Runner, config: dict) -> IdRead:
    """The ids `runner` reads from a draft's config.json (a dict), as the engine's code does:
    the keys in order, the first that gives a non-empty list wins, except that a key with
    `replaces` wins over those keys whenever its parent dict is there (vLLM V1's eagle_config
    over dflash_config, even with no ids: then the default). E.g. V1, {"dflash_config": {"target_layer_ids": [1, 3]}} ->
    capture [2, 4]; V2, {"eagle_config": {AUX_IDS_KEY: [1, 3]}} -> none, the default."""
    found: tuple[Key, list[int]] | None = None
    for key in runner.keys:
        if (key.replaces and _parent_is_dict(config, key.path)
                and (found is None or found[0].path in key.replaces)):
            value = value_at(config, key.path)
            found = (key, [int(i) for i in value]) if value else None
            continue
        if found is not None:
            continue
        value = value_at(config, key.path)
        if value and isinstance(value, (list, tuple)):
            found = (key, [int(i) for i in value])
    if found is None:
        return IdRead(runner, None, None, None)
    key, ids = found
    if key.shift is None:
        return IdRead(runner, key, ids, None)
    shift = 0 if config.get("model_type") in key.raw_for else key.shift
    return IdRead(runner, key, ids, [i + shift for i in ids])


def vllm_runner(device: str = "cuda", env: str | None = None,
                parallel_drafting: bool = False, method: str = "eagle3") -> tuple[Runner, str]:
    """The runner vLLM 0.32 uses, and why (config/vllm.py `use_v2_model_runner`, 703-739):
    VLLM_USE_V2_MODEL_RUNNER when set; else V1 without Triton (the CPU build) or with a
    feature V2 lacks (for EAGLE: parallel_drafting); else V2. DSpark exists only in V2."""
    if env is not None and env.strip() != "":
        v2 = env.strip().lower() in ("1", "true")
        return (VLLM_V2 if v2 else VLLM_V1), f"VLLM_USE_V2_MODEL_RUNNER={env}"
    if device == "cpu":
        return VLLM_V1, "the CPU build has no Triton backend, so V1"
    if parallel_drafting:
        return VLLM_V1, "parallel_drafting is not in V2 yet, so V1"
    return VLLM_V2, f"a {device.upper()} device with Triton, {method}: V2, the default"
