"""The doctor from config files alone: which target layers each engine and runner will feed a
draft, what its config says it was trained on, and where they part. Nothing but the draft's
config.json, its weights' safetensors headers (names and shapes; no tensor is read or mapped)
and the target's config.json is read, so a 61-layer target answers in well under a second
without its tokenizer or weights. The evidence from weights (eyas/doctor/diagnose.py) needs
the target itself. Its verdict is the doctor's one `Verdict` (eyas/doctor/verdict.py) with a
`ConfigReading` and no evidence.

Feeds come from the engine rule as data (eyas/conventions/rules.py) for every draft family
engines serve today, EAGLE-3 and the newer ones (DFlash, DSpark, Domino, P-EAGLE): eyas trains
and scores EAGLE-3 drafts, and for the others says what each engine feeds and that it cannot
yet score them.
"""
from __future__ import annotations

import json
from pathlib import Path

from eyas.conventions import vllm_dflash, vllm_dspark
from eyas.conventions.engines import engine_rules
from eyas.conventions.rules import (ID_PATHS, TRAINER_ID_SHIFT, VLLM_RUNNERS, Runner, value_at,
                                   vllm_runner)
from eyas.conventions.vllm import AUX_IDS_KEY as AUX
from eyas.conventions.feeds import feeds, slot_names
from eyas.doctor.findings import Finding
from eyas.doctor.reading import ConfigReading
from eyas.doctor.verdict import Verdict
from eyas.draft.directory import CONFIG_FILE, LAYOUT_KEY, MODEL_ARGS_KEY, read_config
from eyas.conventions.kinds import FAMILY_KEY
from eyas.draft.eagle3.formats.own import lost_norm_options
from eyas.draft.weights import tensor_shapes
from eyas.conventions.kinds import DraftKind, draft_kind
from eyas.conventions.vllm_checkpoint import (MASK_TOKEN_KEY, OTHER_MASK_TOKEN_KEYS, read_mask_token_id,
                                              read_norm_options)
from eyas.layout import Slot, TargetIdentity

from eyas.targets import TargetError, read_config_file, shape_from_config, text_config

def _claimed(config: dict, kind: DraftKind, target: TargetIdentity, trainer: str | None
             ) -> tuple[list[str] | None, str, str]:
    """(slots the config says the draft was trained on, how, what is undecided). Ids only
    under eagle_config are read one way whatever the draft's architecture: as SGLang's
    convention (output of layer k), as SpecForge and TorchSpec write them, unless `trainer`
    is "vllm" (input of layer k)."""
    n = target.num_layers
    if LAYOUT_KEY in config:
        return list(config[LAYOUT_KEY]["draft_inputs"]), "eyas_layout, by slot name", ""
    if kind.block:
        ids = ((config.get("dflash_config") or {}).get("target_layer_ids")
               or config.get("target_layer_ids"))
        if ids:
            return ([Slot("block_out", i).name for i in ids if 0 <= i < n],
                    "target_layer_ids: outputs of layers (the DFlash convention)", "")
        spark = config.get("dspark_target_layer_ids")
        if spark:
            shift = 0 if config.get("model_type") == "deepseek_v41" else 1
            return (slot_names([i + shift for i in spark], n), "dspark_target_layer_ids", "")
        return None, "no target_layer_ids", ""
    top, nested = config.get(AUX), (config.get("eagle_config") or {}).get(AUX)
    if top:
        return slot_names(sorted(set(top)), n) if max(top) <= n else None, (
            "top-level eagle_aux_hidden_state_layer_ids, vLLM's convention (input of layer k)"
        ), ""
    if nested:
        shift = TRAINER_ID_SHIFT.get(trainer, 1)  # unknown: SpecForge's, the usual writer
        if max(nested) + shift > n:
            return None, "eagle_config's ids only", (
                f"eagle_config.{AUX} {nested} point past the target's {n} layers under "
                f"{'vLLM' if shift == 0 else 'SGLang'}'s convention: is it for another target?")
        return (slot_names(sorted({i + shift for i in nested}), n),
                f"eagle_config's ids only, read as {'vLLM' if shift == 0 else 'SGLang'}'s "
                f"convention ({'input' if shift == 0 else 'output'} of layer k), as "
                f"{'vLLM users' if shift == 0 else 'SpecForge and TorchSpec'} write them; "
                f"trainer={'specforge' if shift == 0 else 'vllm'} reads them the other way", "")
    return None, "no ids", (
        "the config names no ids, so what the draft was trained on is unknown; each engine "
        "then feeds its default (the layers above). A draft trained with its trainer's "
        "defaults (SpecForge's and EAGLE's [1, N//2-1, N-4] as layer outputs) was trained on "
        "those; the weights' evidence settles it (run the doctor with the target and --data)")


def _options(config: dict, kind: DraftKind, trainer: str | None) -> list[Finding]:
    """Norm options whose meaning the engine and the trainer may not share."""
    lost = lost_norm_options(config)  # an eyas draft is held to its record
    out = [Finding("norm_options", f"eyas {lost}")] if lost else []
    if (read_norm_options(config)["norm_output"] and trainer == "specforge" and kind.llama_eagle3):
        out.append(Finding("norm_options", (
            "norm_output: true in a SpecForge config: before SpecForge PR #879 it meant a norm "
            "before lm_head only, with the pre-norm state fed back (vLLM's norm_output: "
            "false); vLLM reads it as feeding the post-norm state back. If the draft was "
            "trained before #879, write norm_output: false")))
    return out


def trainer_of(config: dict, kind: DraftKind) -> str | None:
    """The tool that wrote the config, where its shape says so (ids only under eagle_config:
    SpecForge or TorchSpec, whose conventions agree)."""
    if MODEL_ARGS_KEY in config or LAYOUT_KEY in config:
        return "eyas"
    if kind.trainer:
        return kind.trainer
    eagle = config.get("eagle_config") or {}
    if eagle.get(AUX) and not config.get(AUX) and not kind.block:
        return "specforge"  # (or TorchSpec: the same convention)
    return None


def _id_lists(config: dict):
    """(dotted path, value) of each id key the config holds, of those some runner reads."""
    for path in ID_PATHS:
        value = value_at(config, path)
        if value is not None:
            yield path, value


def _check_ids(config: dict, where: Path, n: int) -> None:
    """Each id list the config holds is a list of layer numbers: a negative id or one that is
    not a whole number is refused naming the file, the key and the value."""
    for name, node in _id_lists(config):
        bad = ([node] if not isinstance(node, list) else
               [i for i in node if isinstance(i, bool) or not isinstance(i, int) or i < 0])
        if bad:
            raise ValueError(
                f"{where}: {name} = {json.dumps(node)}: {json.dumps(bad[0])} is not a layer "
                f"of the target (ids are whole numbers 0..{n}, counting the target's "
                f"{n} layers); write the layers the draft was trained on there")


def examine(draft_dir, target_config, trainer: str | None = None,
            engine: str = "vllm", device: str | None = None) -> Verdict:
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
        target_dict, source = read_config_file(path), str(path)
    target = shape_from_config(target_dict, source)
    _check_ids(config, draft_dir / CONFIG_FILE, target.num_layers)
    vocab = text_config(target_dict).get("vocab_size")
    kind = draft_kind(config)
    try:
        shapes = tensor_shapes(draft_dir)
    except (OSError, ValueError):
        shapes = {}
    fc = shapes.get("fc.weight")
    weights_fc = fc[1] // target.hidden_size if fc and fc[1] % target.hidden_size == 0 else None
    trainer = trainer or trainer_of(config, kind)
    claimed, says, undecided = _claimed(config, kind, target, trainer)
    reading = ConfigReading(str(draft_dir / CONFIG_FILE), kind, target, vocab, claimed, says,
                            feeds(config, kind, target, weights_fc,
                                  ("d2t" in shapes) if shapes else None), weights_fc,
                            undecided=undecided, tensor_names=sorted(shapes) if shapes else None)
    runner = None
    if device is not None and len(engine_rules(engine).runners) > 1:  # the device picks one
        runner, why = vllm_runner(device, parallel_drafting=kind.parallel_drafting)
        reading.assumed = f"{runner.label} ({why})"
    reading.target_positions = text_config(target_dict).get("max_position_embeddings")
    verdict = Verdict(reading=reading)
    _judge(verdict, config, trainer, engine, runner)
    return verdict


def _judge(v: Verdict, config: dict, trainer: str | None, engine: str,
           runner: Runner | None) -> None:
    kind = v.reading.kind
    if not kind.readable:
        v.notes.append(f"a {kind.name} draft: eyas reads what each engine feeds it, but cannot yet "
                       "train or score this family (no evidence from its weights)")
    if not v.reading.weights_fc:
        v.notes.append("no weights at hand (or none that fit the target's width): fc's width "
                       "was taken from the config")
    draft_vocab, vocab = config.get("draft_vocab_size"), config.get("vocab_size")
    if v.reading.target_vocab and vocab and int(vocab) != int(v.reading.target_vocab):
        v.findings.append(Finding("vocab", (
            f"the draft's vocab_size {vocab} differs from the target's {v.reading.target_vocab}: d2t "
            "maps draft ids into the target's vocabulary; is it for another target?")))
    if draft_vocab and vocab and int(draft_vocab) < int(vocab):
        v.notes.append(f"reduced vocabulary: {draft_vocab} of {vocab} tokens, mapped by d2t")
    v.findings += _options(config, kind, trainer)
    v.findings += _mask(v, config)
    v.findings += _empty_ids(v, config)
    v.findings += _short_positions(v, config)
    v.findings += _attention_mode(v, config)
    spark_k = vllm_dspark.served_k(config) if kind.name in vllm_dspark.KINDS else None
    if spark_k is not None:
        v.notes.append(f"a DSpark block of {spark_k} drafting slots: serve it with "
                       f"num_speculative_tokens = {spark_k}, the block's slots attend to each "
                       "other")
    elif kind.block and config.get("block_size"):
        v.notes.append(f"trained on blocks of {config['block_size']} (vLLM never reads "
                       f"block_size): serve it with num_speculative_tokens = "
                       f"{int(config['block_size']) - 1}, the block's masks attend to each other")
    vllm_serves = [f for f in v.reading.feeds if f.runner in VLLM_RUNNERS and not f.refused]
    if not vllm_serves:
        v.findings.append(Finding("not_served", "vLLM does not serve this draft on this target: "
                                  + "; ".join(dict.fromkeys(f.refused for f in v.reading.feeds
                                                            if f.runner in VLLM_RUNNERS))))
    for f in v.reading.feeds:
        if f.refused:
            if vllm_serves:
                v.notes.append(f"{f.runner.label} does not serve it: {f.refused}")
            continue
        if f.problems:
            message = f"{f.runner.label}: " + "; ".join(f.problems)
        elif v.reading.claimed is not None and f.slots is not None and f.slots != v.reading.claimed:
            message = (f"{f.runner.label} feeds {f.slots} ({f.where}) but the config says the "
                       f"draft was trained on {v.reading.claimed}: {_fix(kind)}")
        else:
            continue
        if f.runner in engine_rules(engine).runners and runner in (None, f.runner):
            v.findings.append(Finding("engine_feed", message))
        else:
            v.notes.append(f"(not {runner.label if runner else engine}) {message}")
    v1, v2 = v.reading.feeds[0], v.reading.feeds[1]
    if (len(engine_rules(engine).runners) > 1 and runner is None and not v1.refused
            and not v2.refused and None not in (v1.slots, v2.slots) and v1.slots != v2.slots):
        v.findings.append(Finding("runners_disagree", (
            f"vLLM's V1 runner (CPU; GPU with parallel_drafting or VLLM_USE_V2_MODEL_RUNNER=0) "
            f"feeds {v1.slots}, its V2 runner (a GPU's default) {v2.slots}: {_fix(kind)}")))


def _attention_mode(v: Verdict, config: dict) -> list[Finding]:
    """A DFlash-format draft served with another attention mode than it was trained with
    (Automodel #2913: drafts trained causally need dflash_config.causal stamped). eyas's own
    drafts record it (non-causal); for others the doctor says what vLLM will do."""
    if v.reading.kind.name not in vllm_dflash.KINDS:
        return []
    causal, source = vllm_dflash.served_causal(config)
    served = ("causally" if all(causal) else "non-causally" if not any(causal)
              else f"causally in layers {[i for i, c in enumerate(causal) if c]} only")
    if config.get(FAMILY_KEY):  # eyas trained it: every block non-causal
        if any(causal):
            return [Finding("attention_mode", (
                f"eyas trained this DFlash draft non-causally, but vLLM would serve it "
                f"{served} (from {source}): set dflash_config.causal to false and remove "
                "is_causal"))]
        return []
    v.notes.append(f"vLLM serves this DFlash draft's blocks {served} (from {source}); a draft "
                   "trained the other way (Automodel #2913: trained causally, served "
                   "non-causally) must say so in dflash_config.causal")
    return []


def _short_positions(v: Verdict, config: dict) -> list[Finding]:
    """A draft whose max_position_embeddings is shorter than the target's: past it the draft
    is never accepted. vLLM 0.32 raises the value for method eagle/eagle3
    (config/speculative.py `_maybe_override_draft_max_position_embeddings`, vLLM #48894), yet
    an EAGLE-3 draft of SmolLM2 cut to 64 served tau 1.000 there, every draft rejected, on
    prompts of 57-404 tokens (bench/damage.py, docs/doctor.md); earlier versions clamped the
    drafter to it (NeMo-RL #3960, a drafter republished only to raise 2048 to 40960)."""
    target = v.reading.target_positions
    if not isinstance(target, int):
        return []
    return positions_finding(config, v.reading.draft, target, v.reading.kind,
                             "the target's max_position_embeddings")


def positions_finding(config: dict, where, length: int, kind: DraftKind, what: str
                      ) -> list[Finding]:
    """"short_positions" when the draft config's (read from `where`) max_position_embeddings
    is shorter than `length` tokens (`what` they are): the rotary range it declares ends
    before the sequences it serves (or was trained on)."""
    draft = config.get("max_position_embeddings")
    if not isinstance(draft, int) or draft >= length:
        return []
    engine = ("vLLM 0.32 sizes its rotary cache from it" if kind.block else
              "vLLM 0.32 says it raises it for EAGLE drafts, yet served such a draft of "
              "SmolLM2 cut to 64 at tau 1.000, every draft rejected (docs/doctor.md); earlier "
              "vLLM clamped the drafter to it (NeMo-RL #3960)")
    return [Finding("short_positions", (
        f"{where}: max_position_embeddings {draft} is shorter than "
        f"{what} ({length} tokens): {engine}; set it to at least {length} (RoPE has no "
        "weights: nothing else changes)"))]


def zeroed_tensors(draft_dir) -> list[Finding]:
    """"zeroed_tensor": a weight of the draft's safetensors all zero (no bias, no index):
    nothing trained writes that; a draft saved before its weights were filled does."""
    from eyas.draft.weights import read_tensors

    try:
        tensors = read_tensors(draft_dir)
    except (OSError, ValueError):
        return []
    zero = [n for n, t in tensors.items()
            if t.is_floating_point() and t.numel() and not n.endswith(".bias") and not t.any()]
    if not zero:
        return []
    return [Finding("zeroed_tensor", (
        f"{Path(draft_dir)}: {', '.join(zero)} all zero in the draft's weights: nothing "
        "training writes; re-export the draft from its last checkpoint"))]


def _empty_ids(v: Verdict, config: dict) -> list[Finding]:
    """An id list written empty: every engine reads it as absent and feeds its default (vLLM's
    and SGLang's rules skip a key without ids; tokenspeed #526 likewise), which is what the
    draft was trained on only by chance."""
    out = []
    for name, node in _id_lists(config):
        if node == []:
            fed = "; ".join(f"{f.runner.label} {f.slots}" for f in v.reading.feeds
                            if not f.refused and f.slots is not None)
            out.append(Finding("empty_ids", (
                f"{v.reading.draft}: {name} is an empty list, which the engines read "
                f"as absent: they feed their defaults ({fed or 'none'}), whatever the draft was "
                "trained on; write the ids of the layers it was trained on there (the doctor's "
                "weights' evidence, with --data, says which)")))
    return out


# where vLLM 0.32 reads a parallel drafter's mask token id, in its order
MASK_ID_KEYS = ("dflash_config.mask_token_id", MASK_TOKEN_KEY, *OTHER_MASK_TOKEN_KEYS)


def _mask(v: Verdict, config: dict) -> list[Finding]:
    """A parallel draft's mask: its token id, and P-EAGLE's mask_hidden tensor, without which
    vLLM refuses to boot (llama_eagle3.py load_weights)."""
    if not v.reading.kind.masked:
        return []
    out, mask = [], read_mask_token_id(config)
    if mask is None:
        out.append(Finding("mask_id", (
            f"a {v.reading.kind.name} draft drafts its later positions from a mask token, whose id vLLM reads "
            f"from {', '.join(MASK_ID_KEYS)}: none is set, so it refuses to boot; set "
            "mask_token_id to the id the draft was trained with")))
    elif v.reading.target_vocab and not 0 <= mask < int(v.reading.target_vocab):
        out.append(Finding("mask_id", (
            f"mask token id {mask} is outside the target's vocabulary of {v.reading.target_vocab}")))
    names = v.reading.tensor_names
    if v.reading.kind.parallel_drafting and names is not None:
        hidden = [n for n in names if n.split(".")[-1] == "mask_hidden"]
        if not hidden:
            out.append(Finding("mask_hidden", (
                "a P-EAGLE draft's later positions read a learned mask_hidden state "
                f"[{v.reading.weights_fc or 'n'} x {v.reading.target.hidden_size}]; its weights have none, and "
                "vLLM refuses to load a parallel-drafting EAGLE draft without it")))
    return out


def _fix(kind: DraftKind) -> str:
    if kind.block:
        return ("write the ids as outputs of layers in dflash_config.target_layer_ids only "
                "(both runners and SGLang read it; no top-level list, no eagle_config dict)")
    return (f"write the layout's vLLM ids as top-level {AUX} (both vLLM runners read it first) "
            "and under eagle_config (it sizes fc; SGLang reads only that one, in its own "
            "convention: export for SGLang separately); the doctor's --write-fixed does")
