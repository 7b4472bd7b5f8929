"""The offline speculation profiles the evaluate stage writes (eyas.doctor.profile says the
format): out_dir/speculation_profile.json from the held-out prompts, and
speculation_profile.SET.json per prompt set, each measured with eyas's reference engine at
concurrency 1, greedy. The serve stage's profiles of the same sets are what they are compared
with (eyas.doctor.profile.profile_gap); export copies both beside the draft."""
from __future__ import annotations

from pathlib import Path

from eyas.acceptance import AcceptanceStats
from eyas.doctor.profile import build_profile, profile_file, write_profile
from eyas.draft.directory import read_config
from eyas.conventions.kinds import draft_kind
from eyas.evaluate.measured import request_means, total

PRODUCER = "eyas evaluate (reference engine)"
ENGINE = "eyas reference"


def checkpoint_id(path: str | Path) -> str:
    """A model's id as profiles name it: the last two parts of its path ("org/name"), not the
    machine's full path."""
    return "/".join(Path(path).resolve().parts[-2:])


def write_profiles(out_dir: str | Path, measured: dict[str, tuple[str, list[AcceptanceStats]]],
                   draft_dir, target_dir, k: int, max_new_tokens: int) -> dict[str, str]:
    """One profile per set ({set name: (its source, each request's counters)}); returns
    {set name: file name}. A set whose requests drafted nothing has no profile."""
    config = read_config(draft_dir)
    kind = draft_kind(config)  # its method: the family (another trainer's EAGLE-3 is eagle3)
    block = (config.get("eyas_model_args") or {}).get("block_size", config.get("block_size"))
    written = {}
    for name, (source, requests) in measured.items():
        stats = total(requests, k)
        if stats.drafts == 0:
            continue
        profile = build_profile(
            stats, method=kind.base, draft_id=checkpoint_id(draft_dir),
            target_id=checkpoint_id(target_dir), num_speculative_tokens=k, producer=PRODUCER,
            block_size=block if kind.block else None,
            per_request_means=request_means(requests),
            measurement_conditions={"dataset": name, "source": source, "concurrency": 1,
                                    "temperature": 0.0, "engine": ENGINE, "tp_size": 1,
                                    "requests": len(requests),
                                    "max_new_tokens": max_new_tokens})
        write_profile(Path(out_dir) / profile_file(name), profile)
        written[name] = profile_file(name)
    return written
