"""What one engine runner feeds a draft, from the draft's config.json (and, where at hand, its
weights' fc width and tensor names): the ids it reads (the engine rule as data,
eyas/conventions/rules.py), the target layers they name, the width it builds fc for, what would
crash or be misread, and whether it serves the draft at all (a family or a target it has no
code for). One `Feed` per runner: the doctor's static verdict (eyas/doctor/static.py) holds
every runner's to what the config says the draft was trained on, its engine check
(eyas/doctor/engine.py) the one runner of the engine named.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from eyas.conventions import NoEagle3, check_version, sglang, vllm, vllm_dflash
from eyas.conventions.engines import engine_rules
from eyas.conventions.kinds import DraftKind
from eyas.conventions.rules import RUNNERS, SGLANG, VLLM_RUNNERS, IdRead, Runner, read_ids
from eyas.conventions.vllm import AUX_IDS_KEY as AUX
from eyas.conventions.vllm_checkpoint import read_norm_options
from eyas.layout import HiddenStateLayout, LayoutError, Slot, TargetIdentity, eagle3_default_ids


def slot_names(stream: list[int], n: int) -> list[str]:
    return [Slot.at_stream_index(i, n).name for i in stream]


def hf_indices(stream: list[int], n: int) -> list[int | None]:
    """HF output_hidden_states indices of stream positions (N, pre-norm, has none)."""
    return [i if i < n else None for i in stream]


@dataclass
class Feed:
    """What one engine runner feeds the draft."""

    runner: Runner
    read: IdRead | None
    where: str
    target: TargetIdentity
    stream: list[int] | None = None  # stream positions captured (ascending, distinct)
    fc: int | None = None  # the number of states the engine sizes the draft's fc for
    problems: list[str] = field(default_factory=list)  # crashes or misreads, whatever the slots
    refused: str = ""  # why the runner does not serve this draft (or this target) at all
    version: str | None = None  # the engine version its rules were read for (None: runner's)

    @property
    def n(self) -> int:
        return self.target.num_layers

    @property
    def label(self) -> str:
        """'vLLM 0.32 V1 runner', 'SGLang 0.5.23'."""
        name = self.runner.label
        return name.replace(self.runner.version, self.version, 1) if self.version else name

    @property
    def ids(self) -> list[int] | None:
        """The ids as written under the key it read (None: none, so its default)."""
        return self.read.written if self.read else None

    @property
    def slots(self) -> list[str] | None:
        return None if self.stream is None else slot_names(self.stream, self.n)

    @property
    def layout(self) -> HiddenStateLayout | None:
        """What it feeds, as a layout (the verifier: the last block's output); None where it
        feeds nothing it can use."""
        if self.stream is None or self.refused:
            return None
        return HiddenStateLayout(self.target, tuple(Slot.at_stream_index(i, self.n)
                                                    for i in self.stream),
                                 Slot("block_out", self.n - 1))

    @property
    def key(self) -> str | None:
        """The config key it read the ids from (None: none, so its default)."""
        return self.read.key.path if self.read and self.read.key else None

    def line(self) -> str:
        fed = (f"does not serve it: {self.refused}" if self.refused else
               f"feeds {self.slots} ({self.key or 'no key: its default'})")
        return f"{self.label}: {fed}"

    def to_dict(self) -> dict:
        return {"runner": self.label, "id": self.runner.id, "key": self.key,
                "ids": self.ids, "where": self.where,
                "slots": self.slots, "capture_indices": self.stream,
                "hf_hidden_states": None if self.stream is None else hf_indices(self.stream, self.n),
                "fc_states": self.fc, "problems": self.problems,
                "refused": self.refused or None}


def _fc_states(config: dict, kind: DraftKind, v2_read: IdRead) -> tuple[int, str]:
    """How many states vLLM sizes the draft's fc for, and by which rule (llama_eagle3.py
    209-221 and deepseek_eagle3.py 189-199: num_aux_hidden_states, else the length of
    eagle_config's list, else 3; qwen3_dflash.py 108-117 `_get_dflash_fc_input_size`: the
    length of the V2 runner's ids, else the draft's own num_hidden_layers)."""
    if kind.block:  # ids name outputs of layers, +1 in vLLM
        ids = v2_read.written or []
        if ids or kind.name not in vllm_dflash.KINDS:
            return len(ids), "the number of ids the V2 runner's rule finds (qwen3_dflash.py)"
        layers = int(config.get("num_hidden_layers") or 0)
        return layers, ("no ids, so the draft's num_hidden_layers (qwen3_dflash.py "
                        "`_get_dflash_fc_input_size`)")
    if config.get("num_aux_hidden_states") is not None:
        return int(config["num_aux_hidden_states"]), "num_aux_hidden_states"
    nested = (config.get("eagle_config") or {}).get(AUX)
    if nested:
        return len(nested), "the length of eagle_config's list"
    return 3, "its default of 3"


def _not_served(kind: DraftKind, config: dict, runner: Runner,
                target: TargetIdentity | None = None) -> str | None:
    """Why `runner` refuses this draft outright (config/vllm.py 2978-2991, the registry)."""
    archs = config.get("architectures") or []
    if runner in VLLM_RUNNERS:
        if kind.parallel_drafting and any("PEagle" in a for a in archs):
            renamed = [a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}"
                       for a in archs]  # what method eagle3 asks the registry for
            return (f"vLLM serves P-EAGLE under method eagle3 (with parallel_drafting), which "
                    f"renames architectures {archs} to {renamed} (a name neither starting nor "
                    f"ending with Eagle3 is prefixed: transformers_utils/configs/eagle.py), and "
                    f"its registry holds no such name (it holds PEagleDraftModel itself, "
                    f"model_executor/models/registry.py, never asked for): write architectures "
                    f"[\"LlamaForCausalLMEagle3\"] and serve with method eagle3 and "
                    f"parallel_drafting true, with the mask id as mask_token_id")
        why = vllm_dflash.not_served_by(kind.name, runner.name)
        if why is not None:
            return why
        if runner.name == "V1" and any(a in ("DFlash2DraftModel", "LiLiCorrDraftModel")
                                      for a in archs):
            return "candidate-head DFlash drafts need the V2 runner (a GPU)"
        types = set(config.get("layer_types") or [])
        if runner.name == "V1" and kind.block and len(types) > 1:
            return f"a DFlash draft mixing {sorted(types)} layers needs the V2 runner (a GPU)"
    elif kind.name not in sglang.READ_KINDS:
        return f"SGLang's {kind.name} support has not been read by eyas"
    elif kind.block and target is not None and (
            target.architecture not in sglang.DFLASH_CAPTURE):
        return (f"SGLang {sglang.VERIFIED}'s {target.architecture} has no "
                "set_dflash_layers_to_capture: it refuses a DFlash draft at startup (\"implements "
                "neither set_dspark_layers_to_capture nor set_dflash_layers_to_capture\")")
    return None


def _sglang_feed(config: dict, kind: DraftKind, target: TargetIdentity, version: str | None
                 ) -> tuple[IdRead | None, list[int] | None, str, list[str]]:
    """(read, stream, where, problems) for SGLang `version` (None: the one eyas verified)."""
    n, problems = target.num_layers, []
    if kind.block:  # eyas.conventions.sglang: DFlash's rules in 0.5.23
        dflash = config.get("dflash_config") or {}
        where = ("dflash_config.target_layer_ids" if "target_layer_ids" in dflash else
                 "target_layer_ids" if "target_layer_ids" in config else None)
        ids = dflash.get("target_layer_ids", config.get("target_layer_ids"))
        if ids is None:
            layers = config.get("num_hidden_layers")
            if not isinstance(layers, int) or layers < 1:
                return None, None, "no ids", ["SGLang needs the draft's num_hidden_layers to "
                                              "choose its default ids, and the config has none"]
            try:
                ids = sglang.dflash_default_ids(n, layers)
            except LayoutError as e:
                return None, None, "no ids", [str(e)]
            where = (f"no ids: SGLang's default for a {layers}-layer draft, {ids} "
                     "(speculative/dflash_utils.py build_target_layer_ids)")
        elif not isinstance(ids, list) or not ids:
            return None, None, where, [f"SGLang refuses {where} = {ids!r}: it must be a "
                                       "non-empty list (dflash_utils.py)"]
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            problems.append(f"SGLang refuses ids {bad} outside [0, {n})")
            return None, None, where, problems
        return None, sorted({i + 1 for i in ids}), (f"{where}, +1 (the target's "
                                                     "set_dflash_layers_to_capture)"), []
    sglang.rule(target.architecture, version)  # UnverifiedVersion for a version not read
    read = read_ids(SGLANG, config)
    if config.get(AUX) and not read.written:
        problems.append(f"the ids {config[AUX]} are only at the top level, which SGLang "
                        "never reads")
    ignored = sglang.ignored_options(read_norm_options(config), version)
    if ignored:
        problems.append(f"SGLang {version or sglang.VERIFIED} ignores {', '.join(ignored)} "
                        "(and drops any weights it has): it would serve another function than "
                        "the draft's")
    try:
        layout = sglang.from_ids(read.written, target, version)
    except ValueError as e:
        if isinstance(e, NoEagle3):  # a target SGLang has no code for: the caller refuses
            raise
        return read, None, read.where, problems + [str(e)]  # slots silently missing
    return read, [s.stream_index() for s in layout.draft_inputs], read.where, problems


def feeds(config: dict, kind: DraftKind, target: TargetIdentity, weights_fc: int | None,
          has_d2t: bool | None = None) -> list[Feed]:
    """Every runner's feed (eyas/conventions/rules.py RUNNERS, in order: vLLM V1, V2, SGLang).
    `weights_fc`: the states the weights' fc takes; `has_d2t`: whether they hold a d2t
    tensor (None: no weights at hand)."""
    return [_feed(r, config, kind, target, weights_fc, has_d2t) for r in RUNNERS]


def engine_feed(config: dict, kind: DraftKind, target: TargetIdentity, engine: str,
                version: str | None = None, *, weights_fc: int | None = None,
                has_d2t: bool | None = None) -> Feed:
    """What `engine` at `version` feeds the draft: its first runner's feed (vLLM: the V1
    runner, the one its CPU build runs; the V2 runner's is in `feeds`). UnverifiedVersion for
    a version whose rules eyas has not read."""
    runner = engine_rules(engine).runners[0]
    if runner in VLLM_RUNNERS:
        check_version("vLLM", version, vllm.KNOWN_VERSIONS)
    return _feed(runner, config, kind, target, weights_fc, has_d2t, version)


def _feed(runner: Runner, config: dict, kind: DraftKind, target: TargetIdentity,
          weights_fc: int | None, has_d2t: bool | None, version: str | None = None) -> Feed:
    n = target.num_layers
    refused = _not_served(kind, config, runner, target)
    if runner is SGLANG:
        try:
            read, stream, where, problems = _sglang_feed(config, kind, target, version)
        except NoEagle3 as e:
            return Feed(runner, None, "", target, refused=refused or str(e), version=version)
        out = Feed(runner, read, where, target, stream, None, problems, version=version)
        if not kind.block:
            out.fc = sglang.FC_SLOTS  # its llama_eagle3 sizes fc for 3 states, whatever the config
            _check_fc(out, "SGLang's llama_eagle3, whatever the config", weights_fc, refused)
        out.refused = refused or ""
        return out
    read = read_ids(runner, config)
    stream = read.capture if read.capture is not None else list(eagle3_default_ids(n))
    where = read.where if read.key else (f"no key it reads gives ids, so its default "
                                         f"{list(eagle3_default_ids(n))}: {runner.default}")
    out = Feed(runner, read, where, target, sorted(set(stream)), version=version)
    try:
        if vllm.crashes_on_embedding(target.architecture, stream):
            out.problems.append(vllm.EMBEDDING_CRASH)
    except NoEagle3 as e:
        return Feed(runner, read, where, target, None, refused=refused or str(e),
                    version=version)
    bad = [i for i in stream if not 0 <= i <= n]
    if bad:
        out.problems.append(f"capture indices {bad} out of range 0..{n} for a {n}-block "
                                "target: never captured")
        out.stream = [i for i in out.stream or [] if 0 <= i <= n] or None
    out.fc, how = _fc_states(config, kind, read_ids(RUNNERS[1], config))  # DFlash: V2's rule
    _check_fc(out, how, weights_fc, refused)
    if not kind.block and (config.get("eagle_config") or {}).get("use_aux_hidden_state",
                                                                   True) is False:
        out.problems.append("eagle_config.use_aux_hidden_state is false: vLLM feeds no aux "
                            "states and builds no fc")
    draft_vocab = config.get("draft_vocab_size") or config.get("vocab_size")
    if has_d2t and draft_vocab is not None and draft_vocab == config.get("vocab_size"):
        out.problems.append("a d2t tensor in a full-vocabulary draft: vLLM has no parameter "
                            "for it and refuses to load the weights; drop d2t/t2d")
    out.refused = refused or ""
    return out


def _check_fc(out: Feed, how: str, weights_fc: int | None, refused: str | None) -> None:
    """The width the runner sizes fc for (by the rule `how`) against what it captures and
    the weights' fc."""
    if refused:
        return
    if out.stream is not None and len(out.stream) != out.fc:
        out.problems.append(f"it captures {len(out.stream)} states but sizes fc for "
                            f"{out.fc} ({how}): the first draft step crashes on the width")
    if weights_fc is not None and weights_fc != out.fc:
        out.problems.append(f"it sizes fc for {out.fc} states ({how}) but the weights' fc "
                            f"takes {weights_fc}: loading fails on fc.weight's shape")
