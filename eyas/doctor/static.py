"""The doctor from config files alone: which target layers each engine and runner will feed a
draft, what its config says it was trained on, and where they part. Nothing but the draft's
config.json, its weights' safetensors headers (names and shapes; no tensor is read or mapped)
and the target's config.json is read, so a 61-layer target answers in well under a second
without its tokenizer or weights. The evidence from weights (eyas/doctor/diagnose.py) needs
the target itself.

Feeds come from the engine rule as data (eyas/conventions/rules.py) for every draft family
engines serve today, EAGLE-3 and the newer ones (DFlash, DSpark, Domino, P-EAGLE): eyas trains
and scores EAGLE-3 drafts, and for the others says what each engine feeds and that it cannot
yet score them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eyas.conventions import NoEagle3, family, sglang
from eyas.conventions.rules import (AUX, RUNNERS, SGLANG, IdRead, Runner, read_ids,
                                    vllm_runner)
from eyas.doctor.findings import Finding
from eyas.draft.directory import CONFIG_FILE, LAYOUT_KEY, MODEL_ARGS_KEY, read_config
from eyas.draft.load import TRAINED as TRAINED_BY_EYAS
from eyas.draft.load import draft_family
from eyas.draft.eagle3.formats.weights import tensor_shapes
from eyas.conventions.vllm_checkpoint import read_norm_options
from eyas.layout import Slot, TargetIdentity, eagle3_default_ids
from eyas.targets import TargetError, shape_from_config, text_config

BLOCK_FAMILIES = ("dflash", "dspark", "domino")  # ids name outputs of layers, +1 in vLLM


def _names(stream: list[int], n: int) -> list[str]:
    return [Slot.at_stream_index(i, n).name for i in stream]


def _hf(stream: list[int], n: int) -> list[int | None]:
    """HF output_hidden_states indices of stream positions (N, pre-norm, has none)."""
    return [i if i < n else None for i in stream]


@dataclass
class RunnerFeed:
    """What one engine runner feeds the draft."""

    runner: Runner
    read: IdRead | None
    where: str
    stream: list[int] | None = None  # stream positions captured (ascending, distinct)
    n: int = 0
    fc: int | None = None  # the number of states the engine sizes the draft's fc for
    problems: list[str] = field(default_factory=list)
    refused: str = ""  # why the runner does not serve this draft (or this target) at all

    @property
    def slots(self) -> list[str] | None:
        return None if self.stream is None else _names(self.stream, self.n)

    def to_dict(self) -> dict:
        return {"runner": self.runner.label, "id": self.runner.id,
                "key": self.read.key.path if self.read and self.read.key else None,
                "ids": self.read.written if self.read else None, "where": self.where,
                "slots": self.slots, "capture_indices": self.stream,
                "hf_hidden_states": None if self.stream is None else _hf(self.stream, self.n),
                "fc_states": self.fc, "problems": self.problems,
                "refused": self.refused or None}


@dataclass
class StaticVerdict:
    draft: str
    family: str
    target: TargetIdentity
    target_vocab: int | None
    claimed: list[str] | None  # the slots the config says the draft was trained on
    says: str  # how it says so, in words
    feeds: list[RunnerFeed]
    weights_fc: int | None  # states the weights' fc takes (None: no weights at hand)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    undecided: str = ""  # what the config leaves open, and the question that settles it
    assumed: str = ""  # the vLLM runner the deployment uses, and why; "": both are held to it

    @property
    def status(self) -> str:
        if self.findings:
            return f"FAULT ({', '.join(dict.fromkeys(f.name for f in self.findings))})"
        return "INCONCLUSIVE" if self.undecided else "OK"

    @property
    def ok(self) -> bool:
        return not self.findings and not self.undecided

    def explain(self) -> str:
        t = self.target
        lines = [f"skew doctor (config only): {self.status}",
                 f"draft: {self.draft} ({self.family}); target {t.architecture}, "
                 f"{t.num_layers} layers, hidden {t.hidden_size}",
                 *([f"assumed: {self.assumed}"] if self.assumed else []),
                 f"trained on (the config says): "
                 f"{self.claimed if self.claimed is not None else 'unknown'} ({self.says})"]
        for f in self.feeds:
            if f.refused:
                would = (f"; as written it would feed {f.slots}, from {f.where}"
                         if f.slots is not None else "")
                lines.append(f"{f.runner.label}: does not serve it: {f.refused}{would}")
                continue
            fed = f"feeds {f.slots}" if f.slots is not None else "feeds nothing it can use"
            lines.append(f"{f.runner.label}: {fed}, from {f.where}")
            lines += [f"  would fail: {p}" for p in f.problems]
        lines += [f"- {f.name}: {f.message}" for f in self.findings]
        if self.undecided:
            lines.append(f"- undecided: {self.undecided}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        t = self.target
        n = t.num_layers
        claimed_stream = (None if self.claimed is None else
                          [Slot.parse(s, n).stream_index() if s != "final_norm" else n
                           for s in self.claimed])
        return {"status": self.status, "ok": self.ok, "draft": self.draft,
                "family": self.family, "eyas_trains_it": self.family in TRAINED_BY_EYAS,
                "target": {"architecture": t.architecture, "num_layers": n,
                           "hidden_size": t.hidden_size, "vocab_size": self.target_vocab},
                "claimed": {"slots": self.claimed, "says": self.says,
                            "hf_hidden_states": None if claimed_stream is None
                            else _hf(claimed_stream, n)},
                "weights_fc_states": self.weights_fc,
                "engines": [f.to_dict() for f in self.feeds],
                "findings": [vars(f) for f in self.findings], "undecided": self.undecided,
                "assumed_runner": self.assumed or None,
                "notes": self.notes, "explain": self.explain()}


# -- reading the configs -------------------------------------------------------------------
def _fc_states(config: dict, fam: str, v2_read: IdRead) -> tuple[int, str]:
    """How many states vLLM sizes the draft's fc for, and by which rule (llama_eagle3.py
    209-221 and deepseek_eagle3.py 189-199: num_aux_hidden_states, else the length of
    eagle_config's list, else 3; qwen3_dflash.py 108-117: the length of the V2 runner's ids)."""
    if fam in BLOCK_FAMILIES:
        ids = v2_read.written or []
        return len(ids), "the number of ids the V2 runner's rule finds (qwen3_dflash.py)"
    if config.get("num_aux_hidden_states") is not None:
        return int(config["num_aux_hidden_states"]), "num_aux_hidden_states"
    nested = (config.get("eagle_config") or {}).get(AUX)
    if nested:
        return len(nested), "the length of eagle_config's list"
    return 3, "its default of 3"


def _not_served(fam: str, config: dict, runner: Runner) -> str | None:
    """Why `runner` refuses this draft outright (config/vllm.py 2978-2991, the registry)."""
    archs = config.get("architectures") or []
    if runner.engine == "vllm":
        if fam == "peagle" and any("PEagle" in a for a in archs):
            return ("vLLM has no PEagleDraftModel (its registry maps no such name): write "
                    "architectures [\"LlamaForCausalLMEagle3\"] and serve with method eagle3 and "
                    "parallel_drafting true, with the mask id as mask_token_id")
        if fam == "domino":
            return "vLLM 0.32's registry has no Domino draft model"
        if runner.name == "V1" and fam == "dspark":
            return "DSpark exists only in the V2 runner (a GPU)"
        if runner.name == "V1" and any(a in ("DFlash2DraftModel", "LiLiCorrDraftModel")
                                      for a in archs):
            return "candidate-head DFlash drafts need the V2 runner (a GPU)"
        types = set(config.get("layer_types") or [])
        if runner.name == "V1" and fam == "dflash" and len(types) > 1:
            return f"a DFlash draft mixing {sorted(types)} layers needs the V2 runner (a GPU)"
    elif fam in ("domino", "peagle") or fam.startswith("speculators"):
        return f"SGLang's {fam} support has not been read by eyas"
    return None


def _sglang_feed(config: dict, fam: str, target: TargetIdentity) -> tuple[IdRead | None,
                                                                          list[int] | None,
                                                                          str, list[str]]:
    """(read, stream, where, problems) for SGLang 0.5.23."""
    n, problems = target.num_layers, []
    if fam in BLOCK_FAMILIES:  # srt/speculative/dflash_utils.py 556-585, 650-660
        ids = (config.get("dflash_config") or {}).get("target_layer_ids") or config.get(
            "target_layer_ids")
        if not ids:
            return None, None, "no dflash_config.target_layer_ids or target_layer_ids", [
                "SGLang refuses a DFlash draft without target_layer_ids"]
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            problems.append(f"SGLang refuses ids {bad} outside [0, {n})")
            return None, None, "dflash_config.target_layer_ids", problems
        return None, sorted({i + 1 for i in ids}), ("dflash_config.target_layer_ids, +1 "
                                                     "(srt/speculative/dflash_utils.py)"), []
    read = read_ids(SGLANG, config)
    try:
        layout = sglang.from_ids(read.written, target)
    except NoEagle3:
        raise
    except ValueError as e:  # slots silently missing
        return read, None, read.where, [str(e)]
    if (config.get(AUX) and not read.written):
        problems.append(f"the ids {config[AUX]} are only at the top level, which SGLang "
                        "never reads")
    return read, [s.stream_index() for s in layout.draft_inputs], read.where, problems


def _feed(runner: Runner, config: dict, fam: str, target: TargetIdentity,
          weights_fc: int | None, v2_read: IdRead) -> RunnerFeed:
    n = target.num_layers
    refused = _not_served(fam, config, runner)
    if runner.engine == "sglang":
        try:
            read, stream, where, problems = _sglang_feed(config, fam, target)
        except NoEagle3 as e:
            return RunnerFeed(runner, None, "", None, n, refused=refused or str(e))
        out = RunnerFeed(runner, read, where, stream, n, None, problems)
    else:
        read = read_ids(runner, config)
        stream = read.capture if read.capture is not None else list(eagle3_default_ids(n))
        out = RunnerFeed(runner, read, read.where, sorted(set(stream)), n)
        try:
            if family(target.architecture, "vllm") == "deepseek" and 0 in stream:
                out.problems.append("id 0 (the embedding) crashes vLLM's DeepSeek-family "
                                    "capture (no residual before layer 0)")
        except NoEagle3 as e:
            return RunnerFeed(runner, read, read.where, None, n, refused=refused or str(e))
        bad = [i for i in stream if not 0 <= i <= n]
        if bad:
            out.problems.append(f"capture indices {bad} are outside 0..{n}: never captured")
            out.stream = [i for i in out.stream or [] if 0 <= i <= n] or None
        out.fc, how = _fc_states(config, fam, v2_read)
        if out.stream is not None and len(out.stream) != out.fc and not refused:
            out.problems.append(f"it captures {len(out.stream)} states but sizes fc for "
                                f"{out.fc} ({how}): the first draft step crashes on the width")
        if weights_fc is not None and weights_fc != out.fc and not refused:
            out.problems.append(f"it sizes fc for {out.fc} states ({how}) but the weights' fc "
                                f"takes {weights_fc}: loading fails on fc.weight's shape")
    out.refused = refused or ""
    return out


def _claimed(config: dict, fam: str, target: TargetIdentity) -> tuple[list[str] | None, str,
                                                                        str]:
    """(slots the config says the draft was trained on, how, what is undecided)."""
    n = target.num_layers
    if LAYOUT_KEY in config:
        return list(config[LAYOUT_KEY]["draft_inputs"]), "eyas_layout, by slot name", ""
    if fam in BLOCK_FAMILIES:
        ids = ((config.get("dflash_config") or {}).get("target_layer_ids")
               or config.get("target_layer_ids"))
        if ids:
            return ([Slot("block_out", i).name for i in ids if 0 <= i < n],
                    "target_layer_ids: outputs of layers (the DFlash convention)", "")
        spark = config.get("dspark_target_layer_ids")
        if spark:
            shift = 0 if config.get("model_type") == "deepseek_v41" else 1
            return (_names([i + shift for i in spark], n), "dspark_target_layer_ids", "")
        return None, "no target_layer_ids", ""
    eagle = config.get("eagle_config") or {}
    top, nested = config.get(AUX), eagle.get(AUX)
    if top:
        return _names(sorted(set(top)), n) if max(top) <= n else None, (
            "top-level eagle_aux_hidden_state_layer_ids, vLLM's convention (input of layer k)"
        ), ""
    if nested:
        as_vllm, as_sglang = _names(sorted(set(nested)), n), _names(
            sorted({i + 1 for i in nested}), n) if max(nested) < n else None
        return None, "eagle_config's ids only", (
            f"eagle_config.{AUX} {nested} with no top-level list: read as vLLM's convention "
            f"(input of layer k, as vLLM's trainers write them) they name {as_vllm}; as "
            f"SGLang's (output of layer k, as SpecForge writes them) {as_sglang}. Which tool "
            "trained it settles it; the weights' evidence does too (run the doctor with the "
            "target and --data)")
    return None, "no ids", (
        "the config names no ids, so what the draft was trained on is unknown; each engine "
        "then feeds its default (the layers above). A draft trained with its trainer's "
        "defaults (SpecForge's and EAGLE's [1, N//2-1, N-4] as layer outputs) was trained on "
        "those; the weights' evidence settles it (run the doctor with the target and --data)")


def _options(config: dict, fam: str, trainer: str | None) -> list[Finding]:
    """Norm options whose meaning the engine and the trainer may not share."""
    out = []
    recorded = config.get(MODEL_ARGS_KEY) or {}
    read = read_norm_options(config)
    lost = [k for k in read if k in recorded and bool(recorded[k]) != read[k]]
    if lost:
        out.append(Finding("norm_options", (
            f"eyas trained this draft with {({k: bool(recorded[k]) for k in lost})} but vLLM "
            f"reads {({k: read[k] for k in lost})} from config.json: it would serve another "
            f"function than the one trained; write {({k: bool(recorded[k]) for k in lost})} "
            "at the top level of config.json")))
    if (read["norm_output"] and trainer == "specforge" and fam.startswith("eagle3")):
        out.append(Finding("norm_options", (
            "norm_output: true in a SpecForge config: before SpecForge PR #879 it meant a norm "
            "before lm_head only, with the pre-norm state fed back (vLLM's norm_output: "
            "false); vLLM reads it as feeding the post-norm state back. If the draft was "
            "trained before #879, write norm_output: false")))
    return out


def trainer_of(config: dict, fam: str) -> str | None:
    """The tool that wrote the config, where its shape says so."""
    if MODEL_ARGS_KEY in config or LAYOUT_KEY in config:
        return "eyas"
    if fam.startswith("speculators"):
        return "speculators"
    eagle = config.get("eagle_config") or {}
    if eagle.get(AUX) and not config.get(AUX) and fam not in BLOCK_FAMILIES:
        return "specforge"  # (or TorchSpec: the same convention)
    return None


def examine(draft_dir, target_config, trainer: str | None = None,
            engine: str = "vllm", device: str | None = None) -> StaticVerdict:
    """The static verdict for the draft in `draft_dir` (its config.json, and its weights'
    headers when there) on the target described by `target_config` (a config.json path, a
    directory holding one, or the dict). Every runner's feed is stated; those of `engine`
    (vllm: both runners, or with `device` the one a deployment there uses; sglang) are held
    to what the config claims, the others noted."""
    draft_dir = Path(draft_dir)
    config = read_config(draft_dir)
    if isinstance(target_config, dict):
        target_dict, source = target_config, "target config"
    else:
        path = Path(target_config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise TargetError(f"--target {target_config}: no config.json there")
        import json
        target_dict, source = json.loads(path.read_text()), str(path)
    target = shape_from_config(target_dict, source)
    vocab = text_config(target_dict).get("vocab_size")
    fam = draft_family(config)
    try:
        shapes = tensor_shapes(draft_dir)
    except (OSError, ValueError):
        shapes = {}
    fc = shapes.get("fc.weight")
    weights_fc = fc[1] // target.hidden_size if fc and fc[1] % target.hidden_size == 0 else None
    trainer = trainer or trainer_of(config, fam)
    claimed, says, undecided = _claimed(config, fam, target)
    nested = (config.get("eagle_config") or {}).get(AUX)
    if trainer and claimed is None and nested and fam not in BLOCK_FAMILIES:
        shift = 0 if trainer == "vllm" else 1  # one reading, whatever the draft's architecture
        if max(nested) + shift <= target.num_layers:
            claimed = _names(sorted({i + shift for i in nested}), target.num_layers)
            says, undecided = (f"eagle_config's ids only, read as {trainer}'s convention "
                               f"({'input' if shift == 0 else 'output'} of layer k; --trainer "
                               "says otherwise)"), ""
    v2 = read_ids(RUNNERS[1], config)
    feeds = [_feed(r, config, fam, target, weights_fc, v2) for r in RUNNERS]
    verdict = StaticVerdict(str(draft_dir / CONFIG_FILE), fam, target, vocab, claimed, says,
                            feeds, weights_fc, undecided=undecided)
    runner = None
    if device is not None and engine == "vllm":
        runner, why = vllm_runner(device, parallel_drafting=fam == "peagle")
        verdict.assumed = f"{runner.label} ({why})"
    _judge(verdict, config, fam, trainer, engine, runner)
    return verdict


def _judge(v: StaticVerdict, config: dict, fam: str, trainer: str | None,
           engine: str, runner: Runner | None) -> None:
    if fam not in TRAINED_BY_EYAS:
        v.notes.append(f"a {fam} draft: eyas reads what each engine feeds it, but cannot yet "
                       "train or score this family (no evidence from its weights)")
    if not v.weights_fc:
        v.notes.append("no weights at hand (or none that fit the target's width): fc's width "
                       "was taken from the config")
    draft_vocab, vocab = config.get("draft_vocab_size"), config.get("vocab_size")
    if v.target_vocab and vocab and int(vocab) != int(v.target_vocab):
        v.findings.append(Finding("vocab", (
            f"the draft's vocab_size {vocab} differs from the target's {v.target_vocab}: d2t "
            "maps draft ids into the target's vocabulary; is it for another target?")))
    if draft_vocab and vocab and int(draft_vocab) < int(vocab):
        v.notes.append(f"reduced vocabulary: {draft_vocab} of {vocab} tokens, mapped by d2t")
    v.findings += _options(config, fam, trainer)
    vllm_serves = [f for f in v.feeds if f.runner.engine == "vllm" and not f.refused]
    if not vllm_serves:
        v.findings.append(Finding("not_served", "vLLM does not serve this draft on this target: "
                                  + "; ".join(dict.fromkeys(f.refused for f in v.feeds
                                                            if f.runner.engine == "vllm"))))
    for f in v.feeds:
        if f.refused:
            if vllm_serves:
                v.notes.append(f"{f.runner.label} does not serve it: {f.refused}")
            continue
        held = f.runner.engine == engine and runner in (None, f.runner)
        said = v.findings if held else _Noted(v.notes, runner.label if runner else engine)
        if f.problems:
            said.append(Finding("engine_feed", f"{f.runner.label}: " + "; ".join(f.problems)))
        elif v.claimed is not None and f.slots is not None and f.slots != v.claimed:
            said.append(Finding("engine_feed", (
                f"{f.runner.label} feeds {f.slots} ({f.where}) but the config says the draft "
                f"was trained on {v.claimed}: {_fix(fam)}")))
    v1, v2 = v.feeds[0], v.feeds[1]
    if engine == "vllm" and runner is None and (v1.slots != v2.slots and v1.slots is not None and v2.slots is not None
            and not v1.refused and not v2.refused):
        v.findings.append(Finding("runners_disagree", (
            f"vLLM's V1 runner (CPU; GPU with parallel_drafting or VLLM_USE_V2_MODEL_RUNNER=0) "
            f"feeds {v1.slots}, its V2 runner (a GPU's default) {v2.slots}: {_fix(fam)}")))


class _Noted(list):
    """Findings about an engine other than the one asked about: kept as notes."""

    def __init__(self, notes: list[str], engine: str):
        super().__init__()
        self.notes, self.engine = notes, engine

    def append(self, finding: Finding) -> None:
        self.notes.append(f"(not {self.engine}) {finding.message}")


def _fix(fam: str) -> str:
    if fam in BLOCK_FAMILIES:
        return ("write the ids as outputs of layers in dflash_config.target_layer_ids only "
                "(both runners and SGLang read it; no top-level list, no eagle_config dict)")
    return (f"write the layout's vLLM ids as top-level {AUX} (both vLLM runners read it first) "
            "and under eagle_config (it sizes fc; SGLang reads only that one, in its own "
            "convention: export for SGLang separately); the doctor's --write-fixed does")
