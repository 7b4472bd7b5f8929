"""MLflow stores shared by many runs, and a server that goes away: real MLflow, real processes.

Several runs set up tracking on one new sqlite store at the same instant (the product's
`Tracking`, released together by a barrier): all their runs are found in the store. A real
`mlflow server` killed between two calls of a run's `Tracking`: the run goes on, the calls wait
in RUN_DIR/mlflow_unlogged.jsonl, and `python -m workflows.replay` sends them to the
server once it is back.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from workflows import replay, tracking
from workflows.tracking import Tracking

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

# what a pipeline run does to set up tracking and log: the store checked and the experiment got
# or created (Tracking), a parent run with params, a stage run with metrics
RUN = """
import sys, time
from pathlib import Path
from workflows.tracking import Tracking
uri, run_dir, name, go = sys.argv[1:]
print("ready", flush=True)
while not Path(go).exists():
    time.sleep(0.01)
t = Tracking(uri, "shared", Path(run_dir))
with t.parent(name, {{"run": name}}, {{"eyas.run_dir": run_dir}}):
    with t.stage("prepare", name + "/prepare"):
        t.log_metrics({{"samples": 1.0}})
"""


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_runs_started_together_share_one_new_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    go = tmp_path / "go"
    names = [f"run{i}" for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-c", RUN.format(), uri,
                               str(tmp_path / name), name, str(go)], env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name in names]
    for p in procs:  # every process imported and waiting: then all start at once
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _ in results), [err[-2000:] for _, err in results]
    client = mlflow.MlflowClient(uri)
    experiments = [e for e in client.search_experiments() if e.name == "shared"]
    assert len(experiments) == 1
    runs = client.search_runs([experiments[0].experiment_id])
    found = {r.info.run_name: r for r in runs}
    assert set(found) == set(names) | {f"{n}/prepare" for n in names}
    for n in names:
        child = found[f"{n}/prepare"]
        assert child.data.tags["mlflow.parentRunId"] == found[n].info.run_id
        assert child.data.metrics == {"samples": 1.0} and child.info.status == "FINISHED"
        assert found[n].data.params == {"run": n}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(tmp_path: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        assert proc.poll() is None, "mlflow server exited"
        try:
            mlflow.MlflowClient(f"http://127.0.0.1:{port}").search_experiments(max_results=1)
            return proc
        except Exception:  # not up yet
            time.sleep(0.5)
    raise TimeoutError("mlflow server did not answer in 180 s")


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the server and its workers: gone at once
    proc.wait()


def test_a_server_gone_mid_run_loses_nothing_and_replay_sends_it(tmp_path, monkeypatch,
                                                                 capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once, not in minutes
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    port = _free_port()
    server = _server(tmp_path, port)
    uri = f"http://127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    (run_dir / "train").mkdir(parents=True)
    (run_dir / "train" / "report.json").write_text('{"steps": 6}')
    try:
        t = Tracking(uri, "eyas", run_dir)
        with t.parent("gone", {"train.lr": "0.001"}, {"eyas.stages": "prepare,train"}) as parent:
            with t.stage("prepare", "gone/prepare"):
                t.log_metrics({"train.samples": 24})
            _stop(server)  # between two calls
            with t.stage("train", "gone/train") as train:
                assert train.startswith(tracking.PENDING)
                t.worker_log()(5, {"loss": 2.5})  # what rank 0 of training logs with
                t.log_metrics({"heldout.acc_step0": 0.5})
                t.log_file(run_dir / "train" / "report.json", "train")
            t.log_metrics({"tau": 2.9}, "summary.", run_id=parent)
    finally:
        if server.poll() is None:
            _stop(server)
    err = capsys.readouterr().err
    assert "stopped answering" in err and "mlflow.tracking_uri" in err
    note = t.unlogged_note()
    for key in ("loss", "heldout.acc_step0", "summary.tau", "workflows.replay"):
        assert key in note, note
    kept = [json.loads(line) for line in (run_dir / tracking.UNLOGGED).read_text().splitlines()]
    assert [e["op"] for e in kept] == ["start_run", "metrics", "metrics", "artifact", "end_run",
                                       "metrics", "end_run"]

    server = _server(tmp_path, port)  # back, on the same store
    try:
        assert replay.main([str(run_dir)]) == 0  # python -m workflows.replay
        assert "eyas: sent 7 MLflow calls" in capsys.readouterr().out
        client = mlflow.MlflowClient(uri)
        runs = {r.info.run_name: r for r in client.search_runs(
            [client.get_experiment_by_name("eyas").experiment_id])}
        assert set(runs) == {"gone", "gone/prepare", "gone/train"}
        assert runs["gone"].data.metrics == {"summary.tau": 2.9}
        assert runs["gone"].info.status == "FINISHED"
        assert runs["gone/prepare"].data.metrics == {"train.samples": 24.0}
        trained = runs["gone/train"]
        assert trained.data.tags["mlflow.parentRunId"] == runs["gone"].info.run_id
        assert trained.data.metrics == {"loss": 2.5, "heldout.acc_step0": 0.5}
        assert client.get_metric_history(trained.info.run_id, "loss")[0].step == 5
        assert [a.path for a in client.list_artifacts(trained.info.run_id, "train")] == \
            ["train/report.json"]
        assert trained.info.status == "FINISHED"
        assert not (run_dir / tracking.UNLOGGED).exists()  # sent: kept under another name
        assert list(run_dir.glob("mlflow_unlogged.replayed-*.jsonl"))
    finally:
        _stop(server)
