"""The run directory's folders, and the records in it that more than one stage or tool reads,
each named, read and written here only: `RunDir` (a stage's folder, the trained draft, compare's
output), and the target the prepare stage resolved, RUN_DIR/prepare/target.json, which every
later stage, the doctor, `eyas compare` and the benchmarks find the target by. What the run
directory's lock and markers are is workflows/run_dir.py's."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from eyas.config import STAGES
from eyas.files import atomic_write

TARGET_FILE = "target.json"
MANIFEST_FILE = "manifest.json"  # in prepare/ and extract/: written last, it marks them whole


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def of(cls, path: str | Path) -> "RunDir":
        return cls(Path(path))

    @classmethod
    def of_stage(cls, stage_dir: str | Path) -> "RunDir":
        """The run a stage's folder (e.g. a --data RUN_DIR/extract) belongs to."""
        return cls(Path(stage_dir).parent)

    def stage(self, name: str) -> Path:
        if name not in STAGES:
            raise ValueError(f"{name!r} is not a stage: one of {', '.join(STAGES)}")
        return self.root / name

    @property
    def prepare(self) -> Path:
        return self.stage("prepare")

    @property
    def extract(self) -> Path:
        return self.stage("extract")

    @property
    def evaluate(self) -> Path:
        return self.stage("evaluate")

    @property
    def serve(self) -> Path:
        return self.stage("serve")

    @property
    def draft(self) -> Path:
        """The draft the train stage wrote."""
        return self.stage("train") / "draft"

    @property
    def compare(self) -> Path:
        """`eyas compare`'s default output."""
        return self.root / "compare"


@dataclass(frozen=True)
class TargetRecord:
    """Where the run's target is, what it is (eyas.layout.TargetIdentity's fields; part of
    prepare's output fingerprint, so only what the target IS) and, for a target eyas built or
    converted, its build report."""

    target_path: str
    identity: dict | None = None
    build_report: dict | None = None


def target_file(run_dir: str | Path) -> Path:
    return RunDir.of(run_dir).prepare / TARGET_FILE


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
