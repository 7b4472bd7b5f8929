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

Speculation profiles (eyas.doctor.profile: modelopt's speculation_profile.json) travel with the
draft: those of the evaluate stage (measured offline by eyas's reference engine) and of the
serve stage (measured while serving) are copied beside each exported draft as
speculation_profile.offline[.SET].json and speculation_profile.served[.SET].json, and
speculation_profile.json is the served held-out profile, else the offline one: the file
modelopt's consumers read. A run's draft (RUN_DIR/train/draft) finds them in RUN_DIR/evaluate
and RUN_DIR/serve; `profile_dirs` names other folders. Each is validated first: a broken one
stops the export, naming its problems.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

from eyas.draft.directory import CONFIG_FILE, LAYOUT_KEY, read_config
from eyas.conventions.kinds import draft_kind
from eyas.draft.vocab import check_vocab
from eyas.conventions import sglang, vllm, vllm_checkpoint
from eyas.doctor.profile import PROFILE_FILE, read_profile
from eyas.layout import HiddenStateLayout, LayoutError

PROFILE_SIDES = {"offline": "evaluate", "served": "serve"}  # side -> the run's stage folder
_PROFILE_NAME = re.compile(r"speculation_profile((?:\.[A-Za-z0-9_-]+)?)\.json")  # "" | ".SET"


def find_profiles(draft_dir: str | Path, profile_dirs: dict | None = None) -> dict[str, Path]:
    """{name beside the exported draft: the profile file it copies}, every one validated
    (eyas.doctor.profile.ProfileError names a broken one). `profile_dirs` ({"offline": DIR,
    "served": DIR}) overrides the run's folders, which are looked in only when the draft is a
    run's RUN_DIR/train/draft; a folder given must exist."""
    draft = Path(draft_dir).resolve()
    dirs = ({side: draft.parent.parent / stage for side, stage in PROFILE_SIDES.items()}
            if draft.parent.name == "train" and draft.name == "draft" else {})
    for side, folder in (profile_dirs or {}).items():
        if side not in PROFILE_SIDES:
            raise ValueError(f"profile_dirs[{side!r}]: a side is one of {sorted(PROFILE_SIDES)}")
        if folder is not None and not Path(folder).is_dir():
            raise FileNotFoundError(f"{folder}: no such folder of {side} speculation profiles")
        dirs[side] = folder
    found = {}
    for side, folder in dirs.items():
        for path in sorted(Path(folder).glob("speculation_profile*.json") if folder else []):
            match = _PROFILE_NAME.fullmatch(path.name)
            if match:
                read_profile(path)
                found[f"speculation_profile.{side}{match.group(1)}.json"] = path
    main = found.get("speculation_profile.served.json",
                     found.get("speculation_profile.offline.json"))
    return {**found, PROFILE_FILE: main} if main else found


def _attach_profiles(out: Path, found: dict[str, Path]) -> Path:
    for name, path in found.items():
        shutil.copy2(path, out / name)
    return out


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
                          "ids can be compiled; run eyas doctor data=RUN_DIR/extract "
                          f"draft={draft_dir} target={target_dir} engine=vllm "
                          "write_fixed=DIR and export DIR")
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


def export_vllm(draft_dir: str | Path, out_dir: str | Path, target_dir=None,
                profile_dirs: dict | None = None) -> Path:
    draft_dir, out = Path(draft_dir), Path(out_dir)
    profiles = find_profiles(draft_dir, profile_dirs)
    claims = _foreign(draft_dir, target_dir)
    if claims is not None:
        from eyas.draft import fixed
        return _attach_profiles(
            fixed.write_fixed(draft_dir, out, claims, claims.layout, "vllm"), profiles)
    config, layout = _layout(draft_dir)
    check_vocab_files(draft_dir)
    if draft_kind(config).block:  # its ids under dflash_config, outputs of layers
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
    return _attach_profiles(out, profiles)


def export_sglang(draft_dir: str | Path, out_dir: str | Path, version: str | None = None,
                  target_dir=None, profile_dirs: dict | None = None) -> Path:
    draft_dir, out = Path(draft_dir), Path(out_dir)
    profiles = find_profiles(draft_dir, profile_dirs)
    claims = _foreign(draft_dir, target_dir)
    if claims is not None:
        from eyas.draft import fixed
        sglang.rule(claims.layout.target.architecture, version)
        sglang.refuse_ignored_options(claims.model_args, version, str(draft_dir))
        if claims.num_aux != sglang.FC_SLOTS:
            raise LayoutError(f"{draft_dir}: {claims.num_aux} draft-input slots, but "
                              f"SGLang's EAGLE-3 draft sizes fc for {sglang.FC_SLOTS}")
        return _attach_profiles(fixed.write_fixed(draft_dir, out, claims, claims.layout,
                                                  "sglang", version), profiles)
    config, layout = _layout(draft_dir)
    kind = draft_kind(config)
    if not kind.llama_eagle3:
        raise LayoutError(f"{draft_dir}: a {kind.name} draft; eyas exports chain "
                          "EAGLE-3 drafts for SGLang, whose serving of this family it has not "
                          "verified (export it for vLLM)")
    sglang.rule(layout.target.architecture, version)  # an unread version: nothing else matters
    sglang.refuse_ignored_options(vllm_checkpoint.read_norm_options(config), version,
                                  str(draft_dir))
    if len(layout.draft_inputs) != sglang.FC_SLOTS:
        raise LayoutError(f"{draft_dir}: {len(layout.draft_inputs)} draft-input slots, but "
                          f"SGLang's EAGLE-3 draft sizes fc for {sglang.FC_SLOTS}")
    check_vocab_files(draft_dir)
    ids = sglang.to_ids(layout, version)
    config = sglang.stamp_export(config, version)
    config["eagle_config"] = {**config.get("eagle_config", {}), vllm.AUX_IDS_KEY: ids}
    out.mkdir(parents=True, exist_ok=True)
    weights = vllm_checkpoint.DRAFT_WEIGHTS_FILE
    shutil.copy2(draft_dir / weights, out / weights)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return _attach_profiles(out, profiles)


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
    if engine not in _LAUNCH:
        raise ValueError(f"engine {engine!r}: use vllm or sglang")
    return _LAUNCH[engine](target_dir, draft_dir, k, num_draft_tokens)


def _launch_vllm(target_dir, draft_dir, k: int, num_draft_tokens) -> str:
    from eyas.draft.load import speculative_config

    spec = json.dumps({**speculative_config(read_config(draft_dir)),
                       "model": str(draft_dir), "num_speculative_tokens": k},
                      separators=(",", ":"))
    return shlex.join(["vllm", "serve", str(target_dir), "--speculative-config", spec])


def _launch_sglang(target_dir, draft_dir, k: int, num_draft_tokens) -> str:
    if num_draft_tokens is not None and num_draft_tokens != k + 1:
        raise ValueError(f"speculative_num_draft_tokens={num_draft_tokens} with {k} chain "
                         f"steps (topk 1): SGLang verifies steps + 1 = {k + 1} tokens; "
                         "other values cap the drafted tokens or waste verification")
    return shlex.join(["python", "-m", "sglang.launch_server", "--model-path",
                       str(target_dir), "--speculative-algorithm", "EAGLE3",
                       "--speculative-draft-model-path", str(draft_dir),
                       "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", str(k + 1)])


_LAUNCH = {"vllm": _launch_vllm, "sglang": _launch_sglang}  # the engines eyas exports for
