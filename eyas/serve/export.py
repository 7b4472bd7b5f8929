"""Export a draft for a serving engine, and the exact flags that launch it.

The vLLM directory is what training wrote (ids top-level and under `eagle_config`). SGLang
reads the ids ONLY from `eagle_config.eagle_aux_hidden_state_layer_ids` and means other
tensors by them, so its copy gets ids compiled by the layout contract for the SGLang version
given (None: the newest verified, written into the copy's config); a version whose capture
rule was not read is refused for every target family. The weights keep their names (`fc`,
`midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`). docs/engines.md says what each engine reads.

A draft of another format (eyas.draft.eagle3.formats: vLLM/SGLang configs without eyas's keys,
SpecForge, speculators) is exported with `target_dir` given (its config does not name the
target's depth): each engine's copy gets the config that makes it feed the slots the config
says the draft was trained on, beside its weights unchanged. A config that does not say is
refused: the doctor (--engine, --write-fixed) establishes them.
"""
from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from eyas.draft.directory import CONFIG_FILE, LAYOUT_KEY, read_config
from eyas.draft.families import FAMILY_KEY
from eyas.draft.vocab import check_vocab
from eyas.conventions import sglang, vllm, vllm_checkpoint
from eyas.layout import HiddenStateLayout, LayoutError

SGLANG_FC_SLOTS = 3  # SGLang's llama_eagle3 sizes fc as 3 x target hidden, whatever the config


def _foreign(draft_dir: Path, target_dir):
    """The claims of a draft of another format, or None for an eyas draft."""
    config = read_config(draft_dir)
    if LAYOUT_KEY in config or target_dir is None:
        return None
    from eyas.draft.load import read_claims
    from eyas.targets import identify

    claims = read_claims(draft_dir, identify(target_dir))
    if claims.layout is None:
        raise LayoutError(f"{draft_dir}: {claims.says} ({claims.format} format), so no engine's "
                          "ids can be compiled; run python -m workflows.doctor --data "
                          f"RUN_DIR/extract --draft {draft_dir} --target {target_dir} "
                          "--engine vllm --write-fixed DIR and export DIR")
    args = claims.model_args
    if not claims.has_d2t and args["draft_vocab_size"] < args["vocab_size"]:
        raise LayoutError(f"{draft_dir}: no d2t in a reduced-vocabulary draft; the engine "
                          "would map draft ids to the wrong target tokens")
    return claims


def _layout(draft_dir: Path) -> tuple[dict, HiddenStateLayout]:
    config = read_config(draft_dir)
    if LAYOUT_KEY not in config:
        raise LayoutError(f"{draft_dir}: no {LAYOUT_KEY} in config.json; which tensors the draft "
                          "was trained on is unknown, so no engine's ids can be compiled")
    return config, HiddenStateLayout.from_dict(config[LAYOUT_KEY], str(draft_dir))


def check_vocab_files(draft_dir: Path) -> int:
    """Vocabulary-map invariants of the draft's d2t/t2d; returns the draft vocab size."""
    from safetensors.torch import load_file

    tensors = load_file(str(draft_dir / vllm_checkpoint.DRAFT_WEIGHTS_FILE))
    if "d2t" not in tensors or "t2d" not in tensors:
        raise LayoutError(f"{draft_dir}: d2t/t2d missing; the engine would map draft ids to "
                          "the wrong target tokens")
    check_vocab(tensors["d2t"], tensors["t2d"])
    return int(tensors["d2t"].numel())


def export_vllm(draft_dir: str | Path, out_dir: str | Path, target_dir=None) -> Path:
    draft_dir, out = Path(draft_dir), Path(out_dir)
    claims = _foreign(draft_dir, target_dir)
    if claims is not None:
        from eyas.draft.eagle3 import formats
        return formats.write_fixed(draft_dir, out, claims, claims.layout, "vllm")
    config, layout = _layout(draft_dir)
    check_vocab_files(draft_dir)
    if config.get(FAMILY_KEY) == "dflash":  # its ids under dflash_config, outputs of layers
        from eyas.conventions import vllm_dflash
        reads = vllm_dflash.read_capture(config, layout.target.num_layers, str(draft_dir))
    else:
        reads = vllm_checkpoint.check_draft_config(
            config, layout.target.num_layers, target_architecture=layout.target.architecture,
            source=str(draft_dir))
    if reads != vllm.to_ids(layout):
        raise LayoutError(f"{draft_dir}: its vLLM ids do not compile from its layout")
    if out.resolve() != draft_dir.resolve():
        shutil.copytree(draft_dir, out, dirs_exist_ok=True)
    return out


def export_sglang(draft_dir: str | Path, out_dir: str | Path, version: str | None = None,
                  target_dir=None) -> Path:
    draft_dir, out = Path(draft_dir), Path(out_dir)
    claims = _foreign(draft_dir, target_dir)
    if claims is not None:
        from eyas.draft.eagle3 import formats
        sglang.rule(claims.layout.target.architecture, version)
        sglang.refuse_ignored_options(claims.model_args, version, str(draft_dir))
        if claims.num_aux != SGLANG_FC_SLOTS:
            raise LayoutError(f"{draft_dir}: {claims.num_aux} draft-input slots, but "
                              f"SGLang's EAGLE-3 draft sizes fc for {SGLANG_FC_SLOTS}")
        return formats.write_fixed(draft_dir, out, claims, claims.layout, "sglang", version)
    config, layout = _layout(draft_dir)
    if config.get(FAMILY_KEY, "eagle3") not in ("eagle3", "eagle3.1"):
        raise LayoutError(f"{draft_dir}: a {config[FAMILY_KEY]} draft; eyas exports chain "
                          "EAGLE-3 drafts for SGLang, whose serving of this family it has not "
                          "verified (export it for vLLM)")
    sglang.rule(layout.target.architecture, version)  # an unread version: nothing else matters
    sglang.refuse_ignored_options(vllm_checkpoint.read_norm_options(config), version,
                                  str(draft_dir))
    if len(layout.draft_inputs) != SGLANG_FC_SLOTS:
        raise LayoutError(f"{draft_dir}: {len(layout.draft_inputs)} draft-input slots, but "
                          f"SGLang's EAGLE-3 draft sizes fc for {SGLANG_FC_SLOTS}")
    check_vocab_files(draft_dir)
    ids = sglang.to_ids(layout, version)
    config = {k: v for k, v in config.items() if k != vllm.AUX_IDS_KEY}  # ignored there
    config["eagle_config"] = {**config.get("eagle_config", {}), vllm.AUX_IDS_KEY: ids}
    config["eyas_engine"] = {"engine": "sglang", "version": version or sglang.VERIFIED}
    out.mkdir(parents=True, exist_ok=True)
    weights = vllm_checkpoint.DRAFT_WEIGHTS_FILE
    shutil.copy2(draft_dir / weights, out / weights)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def launch_command(engine: str, target_dir: str, draft_dir: str, num_speculative_tokens: int,
                   num_draft_tokens: int | None = None) -> str:
    """The exact command line that serves `draft_dir` speculatively with `target_dir`.

    SGLang drafts `speculative_num_steps` tokens per round in a chain (topk 1) and verifies
    `speculative_num_draft_tokens` = steps + 1; a draft-token count that differs silently
    caps or wastes steps, so it is refused.
    """
    k = num_speculative_tokens
    if k < 1:
        raise ValueError("num_speculative_tokens must be >= 1")
    if engine == "vllm":
        from eyas.draft.families import speculative_config

        spec = json.dumps({**speculative_config(read_config(draft_dir)),
                           "model": str(draft_dir), "num_speculative_tokens": k},
                          separators=(",", ":"))
        return shlex.join(["vllm", "serve", str(target_dir), "--speculative-config", spec])
    if engine == "sglang":
        if num_draft_tokens is not None and num_draft_tokens != k + 1:
            raise ValueError(f"speculative_num_draft_tokens={num_draft_tokens} with {k} chain "
                             f"steps (topk 1): SGLang verifies steps + 1 = {k + 1} tokens; "
                             "other values cap the drafted tokens or waste verification")
        return shlex.join(["python", "-m", "sglang.launch_server", "--model-path",
                           str(target_dir), "--speculative-algorithm", "EAGLE3",
                           "--speculative-draft-model-path", str(draft_dir),
                           "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                           "--speculative-num-draft-tokens", str(k + 1)])
    raise ValueError(f"engine {engine!r}: use vllm or sglang")
