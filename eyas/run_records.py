"""Records in a run directory that more than one stage or tool reads, each read and written here
only. Today: the target the prepare stage resolved, RUN_DIR/prepare/target.json, which every
later stage, the doctor, `eyas compare` and the benchmarks find the target by."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from eyas.files import atomic_write

TARGET_FILE = "target.json"


@dataclass(frozen=True)
class TargetRecord:
    """Where the run's target is, what it is (eyas.layout.TargetIdentity's fields; part of
    prepare's output fingerprint, so only what the target IS) and, for a target eyas built or
    converted, its build report."""

    target_path: str
    identity: dict | None = None
    build_report: dict | None = None


def target_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / "prepare" / TARGET_FILE


def write_target(run_dir: str | Path, record: TargetRecord) -> Path:
    path = target_file(run_dir)
    atomic_write(path, json.dumps(asdict(record), indent=2, sort_keys=True))
    return path


def read_target(run_dir: str | Path) -> TargetRecord | None:
    """The run's target record; None where its prepare stage has not run."""
    path = target_file(run_dir)
    if not path.exists():
        return None
    info = json.loads(path.read_text())
    return TargetRecord(info["target_path"], info.get("identity"), info.get("build_report"))


def target_path(run_dir: str | Path) -> str:
    """The run's target directory; FileNotFoundError naming the record where there is none."""
    record = read_target(run_dir)
    if record is None:
        raise FileNotFoundError(f"{target_file(run_dir)} is missing: run the prepare stage of "
                                f"{run_dir} first (stages=[prepare,...])")
    return record.target_path
