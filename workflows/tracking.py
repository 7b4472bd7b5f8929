"""MLflow: one parent run per pipeline invocation, one child run per stage.

The default store is a sqlite file under the run directory. The driver creates the store and
the experiment before any worker logs: many workers creating one new sqlite store at once
race on its schema. Workers that log themselves get the tracking URI and their run id.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import mlflow

_PARAM_BATCH = 100


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"  # a Ray job's working-dir copy has no .git


class Tracking:
    def __init__(self, tracking_uri: str | None, experiment: str, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.uri = tracking_uri or f"sqlite:///{run_dir / 'mlflow.db'}"
        mlflow.set_tracking_uri(self.uri)
        os.environ["MLFLOW_TRACKING_URI"] = self.uri  # inherited by local worker processes
        found = mlflow.get_experiment_by_name(experiment)
        if found is None:
            local = self.uri.startswith("sqlite:")
            artifacts = (run_dir / "mlartifacts").as_uri() if local else None
            self.experiment_id = mlflow.create_experiment(experiment, artifact_location=artifacts)
        else:
            self.experiment_id = found.experiment_id
        self.parent_id: str | None = None

    @contextlib.contextmanager
    def parent(self, run_name: str, params: dict[str, str], tags: dict[str, str]):
        with mlflow.start_run(experiment_id=self.experiment_id, run_name=run_name,
                              tags=tags) as run:
            self.parent_id = run.info.run_id
            items = sorted(params.items())
            for i in range(0, len(items), _PARAM_BATCH):
                mlflow.log_params(dict(items[i:i + _PARAM_BATCH]))
            yield run

    @contextlib.contextmanager
    def stage(self, name: str, run_name: str, tags: dict[str, str] | None = None):
        with mlflow.start_run(experiment_id=self.experiment_id, run_name=run_name, nested=True,
                              tags={"eyas.stage": name, **(tags or {})}) as run:
            yield run

    @staticmethod
    def set_tags(tags: dict[str, str], run_id: str | None = None):
        client = mlflow.MlflowClient()
        for k, v in tags.items():
            if run_id:
                client.set_tag(run_id, k, v)
            else:
                mlflow.set_tag(k, v)

    @staticmethod
    def log_metrics(metrics: dict[str, float], prefix: str = "", run_id: str | None = None):
        clean = {f"{prefix}{k}": float(v) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if run_id:
            client = mlflow.MlflowClient()
            for k, v in clean.items():
                client.log_metric(run_id, k, v)
        else:
            mlflow.log_metrics(clean)

    @staticmethod
    def log_json(obj, name: str):
        mlflow.log_text(json.dumps(obj, indent=2, sort_keys=True, default=str), name)

    @staticmethod
    def log_text(text: str, name: str):
        mlflow.log_text(text, name)

    @staticmethod
    def log_figure(figure, name: str):
        import matplotlib.pyplot as plt
        mlflow.log_figure(figure, name)
        plt.close(figure)

    @staticmethod
    def log_file(path: str | Path, folder: str | None = None):
        mlflow.log_artifact(str(path), folder)
