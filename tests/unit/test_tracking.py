"""The MLflow store is checked before any work: an unreachable server or an unwritable sqlite
path stops the pipeline within seconds, before Ray starts, with one `eyas:` paragraph naming
`mlflow.tracking_uri` (exit 2). Real MLflow clients; nothing listens on the port."""
import socket
import time

import pytest
import ray
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS

from workflows import pipeline, tracking


@pytest.fixture
def no_ray(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Ray started before the MLflow store was checked")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _main(tmp_path, uri: str, capsys) -> tuple[int, str, float]:
    started = time.perf_counter()
    code = pipeline.main(["experiment=tiny", "stages=[prepare]", f"run_dir={tmp_path / 'run'}",
                          f"mlflow.tracking_uri={uri}"])
    err = " ".join(capsys.readouterr().err.split())  # the paragraph, unwrapped
    return code, err, time.perf_counter() - started


def test_an_unreachable_server_stops_the_run_before_work(tmp_path, capsys, no_ray):
    uri = f"http://127.0.0.1:{_closed_port()}"
    code, err, seconds = _main(tmp_path, uri, capsys)
    assert code == 2 and seconds < 15, (code, seconds)
    assert err.startswith(f"eyas: mlflow.tracking_uri={uri}: no MLflow tracking server "
                          "answers there (connection refused)"), err
    assert "mlflow server --backend-store-uri" in err and "Traceback" not in err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".eyas.lock"]


def test_an_unwritable_sqlite_store_stops_the_run_before_work(tmp_path, capsys, no_ray):
    (tmp_path / "file.txt").write_text("not a directory")
    db = tmp_path / "file.txt" / "mlflow.db"
    code, err, seconds = _main(tmp_path, f"sqlite:///{db}", capsys)
    assert code == 2 and seconds < 15, (code, seconds)
    assert err.startswith(f"eyas: mlflow.tracking_uri=sqlite:///{db}: the sqlite store"), err
    assert f"(not a directory: {tmp_path / 'file.txt'})" in err
    assert f"{tmp_path / 'file.txt'} must be a writable directory" in err
    assert "Traceback" not in err


def test_a_password_in_the_uri_is_not_printed():
    assert tracking.shown("http://me:secret@host:5000") == "http://me:***@host:5000"
    assert tracking.shown("http://host:5000") == "http://host:5000"


class _RacingServer:
    """A server on which another run creates the experiment between our lookup and create."""

    def __init__(self):
        self.lookups = 0

    def get_experiment_by_name(self, name):
        self.lookups += 1
        if self.lookups == 1:
            return None

        class Found:
            experiment_id, lifecycle_stage = "7", "active"
        return Found()

    def create_experiment(self, name, artifact_location=None):
        raise MlflowException(f"Experiment '{name}' already exists.",
                              RESOURCE_ALREADY_EXISTS)  # as a server or sqlite says it


def test_an_experiment_created_meanwhile_by_another_run_is_found():
    assert tracking.ensure_experiment(_RacingServer(), "eyas", "http://host:5000") == "7"


def test_the_metric_logger_of_a_worker_pickles_without_a_client(tmp_path):
    import pickle

    log = tracking.WorkerLog("http://host:5000", "eyas", "unlogged:x",
                             str(tmp_path / tracking.UNLOGGED), offline=False)
    log._client = object()
    copy = pickle.loads(pickle.dumps(log))
    copy(5, {"loss": 2.0})  # a run the store has not created: kept in the file
    assert '"loss", 2.0' in (tmp_path / tracking.UNLOGGED).read_text()
