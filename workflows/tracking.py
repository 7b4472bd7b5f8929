"""MLflow: one parent run per pipeline invocation, one child run per stage.

Store. The default store is a sqlite file under the run directory; `mlflow.tracking_uri` names
another (a sqlite file or a tracking server), which any number of eyas runs, from any run
directories, may log to at once. Creating a store and an experiment is the one step that races:
many processes creating one new sqlite store at once collide on its schema, and two runs may
both find no experiment and both create it. So the driver, before any worker logs, creates or
opens the store and gets or creates the experiment holding an exclusive lock on `<db>.lock`
beside a sqlite file (the other runs wait for it, a second or so), and takes a concurrent
creator's "already exists" for found.

Checked before work. `Tracking(...)` reaches the store and writes to it (the experiment's
`eyas.last_run` tag) before the pipeline starts Ray, with MLflow's HTTP retries off and a short
timeout: a store that cannot be reached or written stops the run within seconds, with one
paragraph naming `mlflow.tracking_uri`, the address and what to check (`TrackingUnavailable`,
a config error: exit 2).

Never lose a run. After that check, a call that fails (the server went away mid-run) does not
stop the run: it and every later call of the run (runs not yet created included) are appended
to `RUN_DIR/mlflow_unlogged.jsonl`, the run ends saying which metrics wait there, and
`python -m workflows.replay RUN_DIR` sends them once the store answers again. A stage
writes its outputs to the run directory before it logs them, so only the log is missing.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from workflows.config import ConfigError

UNLOGGED = "mlflow_unlogged.jsonl"
PENDING = "unlogged:"  # a run ref whose run the store has not created yet
PROBE_TIMEOUT_S = 10
_PARAM_BATCH, _METRIC_BATCH = 100, 1000
_HTTP_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


class TrackingUnavailable(ConfigError):
    """The MLflow store cannot be reached or written (exit 2, before any work)."""


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"  # a Ray job's working-dir copy has no .git


# ---- the store: where it is, created safely, checked before work ---------------------------

def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (None for other stores, or in-memory sqlite)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path).absolute() if path and path != ":memory:" else None


def shown(uri: str) -> str:
    """The URI without a password, as it is printed."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    return uri.replace(f":{parts.password}@", ":***@", 1)


def artifact_location(uri: str) -> str | None:
    """Beside a sqlite store, its artifacts (RUN_DIR/mlartifacts by default); a server's own
    otherwise."""
    db = sqlite_path(uri)
    return (db.parent / "mlartifacts").as_uri() if db else None


@contextlib.contextmanager
def store_lock(uri: str):
    """Exclusive while a sqlite store is created and its experiment got or created: the other
    runs wait. A no-op for other stores (a server serializes its own writes)."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as handle:  # never removed (run_dir.py)
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_experiment(client: mlflow.MlflowClient, name: str, uri: str) -> str:
    """The experiment's id, created if missing; a concurrent creator's win is taken as found."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location(uri))
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            found = client.get_experiment_by_name(name)  # another run created it just now
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        raise TrackingUnavailable(
            f"mlflow.experiment={name} is deleted in the store {shown(uri)}; restore it "
            f"(mlflow experiments restore --experiment-id {found.experiment_id}) or choose "
            "another mlflow.experiment")
    return found.experiment_id


@contextlib.contextmanager
def quick_http(timeout_s: int = PROBE_TIMEOUT_S):
    """MLflow's HTTP calls fail at once instead of retrying for minutes: for the check only."""
    saved = {k: os.environ.get(k) for k in _HTTP_ENV}
    os.environ.update(dict(zip(_HTTP_ENV, ("0", str(timeout_s)))))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def open_store(uri: str, experiment: str, explicit: bool = True, note: str = "") -> str:
    """Reach the store, get or create the experiment and write to it (its `eyas.last_run`
    tag), safely under other runs doing the same; the experiment id. `TrackingUnavailable`
    within seconds when the store cannot be reached or written."""
    try:
        with quick_http(), store_lock(uri):
            client = mlflow.MlflowClient(uri)
            experiment_id = ensure_experiment(client, experiment, uri)
            client.set_experiment_tag(experiment_id, "eyas.last_run",
                                      note or time.strftime("%Y-%m-%d %H:%M:%S"))
            return experiment_id
    except TrackingUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the store says, it is said in one line
        db = sqlite_path(uri)
        reason = _reason(e)
        raise TrackingUnavailable(_unwritable(uri, db, reason, explicit) if db else
                                  _unreachable(uri, reason)) from e


def _reason(e: BaseException) -> str:
    if isinstance(e, FileExistsError) and e.filename:  # a directory on the way is a file
        return f"not a directory: {e.filename}"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower() + (f": {e.filename}" if e.filename else "")
    text = str(e)
    for needle, said in (("Connection refused", "connection refused"),
                         ("Name or service not known", "unknown host"),
                         ("nodename nor servname", "unknown host"),
                         ("timed out", f"no answer within {PROBE_TIMEOUT_S} s"),
                         ("readonly database", "read-only database"),
                         ("unable to open database file", "unable to open the database file"),
                         ("database is locked", "the database is locked"),
                         ("file is not a database", "not an sqlite database")):
        if needle in text:
            return said
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return first if len(first) <= 160 else first[:157] + "..."


def _unreachable(uri: str, reason: str) -> str:
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return (f"mlflow.tracking_uri={shown(uri)}: no MLflow tracking server answers there "
                f"({reason}); check that the server is running and reachable from here (e.g. "
                f"`mlflow server --backend-store-uri sqlite:////abs/path/mlflow.db --host "
                f"{parts.hostname} --port {port}`), or leave mlflow.tracking_uri unset to log "
                "to RUN_DIR/mlflow.db")
    return (f"mlflow.tracking_uri={shown(uri)}: the MLflow store cannot be reached or written "
            f"({reason}); check the address and that the store is up and writable, or leave "
            "mlflow.tracking_uri unset to log to RUN_DIR/mlflow.db")


def _unwritable(uri: str, db: Path, reason: str, explicit: bool = True) -> str:
    if not explicit:
        return (f"the run's MLflow store {db} (mlflow.tracking_uri unset) cannot be created or "
                f"written ({reason}); check that run_dir={db.parent} is a writable directory "
                "and that mlflow.db there is an MLflow sqlite store, or set mlflow.tracking_uri")
    return (f"mlflow.tracking_uri={uri}: the sqlite store {db} cannot be created or written "
            f"({reason}); {db.parent} must be a writable directory and {db.name} an MLflow "
            "sqlite store: choose another path, or leave mlflow.tracking_uri unset to log to "
            "RUN_DIR/mlflow.db")


# ---- calls that did not reach the store ------------------------------------------------------

def append_unlogged(path: str | Path, entry: dict) -> None:
    """One call per line; appends from the driver and a worker do not interleave."""
    line = json.dumps(entry, sort_keys=True, default=str) + "\n"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line)


def _metric_rows(metrics: dict[str, float], step: int = 0) -> list[list]:
    now = int(time.time() * 1000)
    return [[k, float(v), now, step] for k, v in metrics.items()]


class WorkerLog:
    """How a Ray worker (rank 0 of training) logs `(step, metrics)` to a stage's run: once the
    store fails, to the run's unlogged file instead. Picklable; the client is made where it
    runs."""

    def __init__(self, uri: str, experiment: str, run: str, unlogged: str, offline: bool):
        self.uri, self.experiment, self.run = uri, experiment, run
        self.unlogged, self.offline = unlogged, offline
        self._client = None

    def __getstate__(self):
        return {**self.__dict__, "_client": None}

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        entry = {"op": "metrics", "uri": self.uri, "experiment": self.experiment,
                 "run": self.run, "metrics": _metric_rows(metrics, step)}
        if not self.offline and not self.run.startswith(PENDING):
            try:
                self._client = self._client or mlflow.MlflowClient(self.uri)
                _send(self._client, entry, {})
                return
            except Exception as e:  # noqa: BLE001 - training goes on; the file keeps them
                self.offline = True
                print(f"eyas: MLflow at {shown(self.uri)} stopped answering ({_reason(e)}); "
                      f"training goes on, its metrics are kept in {self.unlogged}",
                      file=sys.stderr)
        append_unlogged(self.unlogged, entry)


# ---- the run's tracking --------------------------------------------------------------------

class Tracking:
    """The parent run and the stage runs of one pipeline invocation; see the module doc."""

    def __init__(self, tracking_uri: str | None, experiment: str, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.uri = tracking_uri or f"sqlite:///{run_dir / 'mlflow.db'}"
        self.experiment = experiment
        self.run_dir = run_dir
        self.unlogged_path = run_dir / UNLOGGED
        self.failure: str | None = None  # why the store stopped answering, once it did
        self._runs: list[str] = []  # refs of the open runs, innermost last
        mlflow.set_tracking_uri(self.uri)
        os.environ["MLFLOW_TRACKING_URI"] = self.uri  # inherited by local worker processes
        self.experiment_id = open_store(self.uri, experiment, tracking_uri is not None,
                                        f"{run_dir} at {time.strftime('%Y-%m-%d %H:%M:%S')}")
        self.client = mlflow.MlflowClient(self.uri)
        self.parent_id: str | None = None

    @property
    def run_id(self) -> str | None:
        """The innermost open run (an `unlogged:` ref when the store could not create it)."""
        return self._runs[-1] if self._runs else None

    def worker_log(self) -> WorkerLog | None:
        """What a worker logs the current run's step metrics with."""
        if self.run_id is None:
            return None
        return WorkerLog(self.uri, self.experiment, self.run_id, str(self.unlogged_path),
                         self.failure is not None)

    def _do(self, entry: dict) -> object | None:
        """Send one call; once the store failed, keep it (and every later one) in the file."""
        entry = {"uri": self.uri, "experiment": self.experiment, **entry}
        refs = [entry.get("run"), entry.get("parent")]
        if self.failure is None and not any(r and r.startswith(PENDING) for r in refs):
            for attempt in range(3):
                try:
                    return _send(self.client, entry, {}, self.experiment_id)
                except Exception as e:  # noqa: BLE001 - the run goes on without the store
                    if sqlite_path(self.uri) and "locked" in str(e) and attempt < 2:
                        time.sleep(0.5 * (attempt + 1))  # another run writing the same file
                        continue
                    self.failure = _reason(e)
                    print(f"eyas: MLflow at mlflow.tracking_uri={shown(self.uri)} stopped "
                          f"answering ({self.failure}); the run goes on and keeps what it "
                          f"would have logged in {self.unlogged_path}", file=sys.stderr)
                    break
        if entry["op"] == "start_run":
            entry["run"] = f"{PENDING}{uuid.uuid4().hex}"
        append_unlogged(self.unlogged_path, entry)
        return entry["run"] if entry["op"] == "start_run" else None

    @contextlib.contextmanager
    def _run(self, run_name: str, tags: dict[str, str]):
        ref = self._do({"op": "start_run", "name": run_name, "tags": tags,
                        "parent": self.run_id, "time": int(time.time() * 1000)})
        self._runs.append(ref)
        status = "FAILED"
        try:
            yield ref
            status = "FINISHED"
        finally:
            self._runs.pop()
            self._do({"op": "end_run", "run": ref, "status": status,
                      "time": int(time.time() * 1000)})

    @contextlib.contextmanager
    def parent(self, run_name: str, params: dict[str, str], tags: dict[str, str]):
        with self._run(run_name, tags) as ref:
            self.parent_id = ref
            items = sorted(params.items())
            for i in range(0, len(items), _PARAM_BATCH):
                self._do({"op": "params", "run": ref, "params": dict(items[i:i + _PARAM_BATCH])})
            yield ref

    @contextlib.contextmanager
    def stage(self, name: str, run_name: str, tags: dict[str, str] | None = None):
        with self._run(run_name, {"eyas.stage": name, **(tags or {})}) as ref:
            yield ref

    def set_tags(self, tags: dict[str, str], run_id: str | None = None):
        self._do({"op": "tags", "run": run_id or self.run_id,
                  "tags": {k: str(v) for k, v in tags.items()}})

    def log_metrics(self, metrics: dict[str, float], prefix: str = "", run_id: str | None = None):
        clean = {f"{prefix}{k}": float(v) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if clean:
            self._do({"op": "metrics", "run": run_id or self.run_id,
                      "metrics": _metric_rows(clean)})

    def log_json(self, obj, name: str):
        self.log_text(json.dumps(obj, indent=2, sort_keys=True, default=str), name)

    def log_text(self, text: str, name: str):
        self._do({"op": "text", "run": self.run_id, "text": text, "name": name})

    def log_figure(self, figure, name: str):
        import matplotlib.pyplot as plt

        if self.failure is None and not self.run_id.startswith(PENDING):
            try:
                self.client.log_figure(self.run_id, figure, name)
                plt.close(figure)
                return
            except Exception:  # noqa: BLE001 - kept as a file, as every call after a failure
                pass
        saved = self.run_dir / "mlflow_unlogged" / self.run_id.replace(":", "-") / name
        saved.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(saved)
        plt.close(figure)
        self.log_file(saved, str(Path(name).parent) if Path(name).parent.name else None)

    def log_file(self, path: str | Path, folder: str | None = None):
        self._do({"op": "artifact", "run": self.run_id, "path": str(Path(path).absolute()),
                  "folder": folder})

    def unlogged_note(self) -> str | None:
        """What the run says at its end while calls wait in the unlogged file (any run's)."""
        return unlogged_note(self.run_dir)


def _read_unlogged(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def unlogged_note(run_dir: Path) -> str | None:
    entries = _read_unlogged(run_dir / UNLOGGED)
    if not entries:
        return None
    metrics = list(dict.fromkeys(m[0] for e in entries if e["op"] == "metrics"
                                 for m in e["metrics"]))
    artifacts = sum(e["op"] in ("text", "artifact") for e in entries)
    runs = sum(e["op"] == "start_run" for e in entries)
    shown_metrics = ", ".join(metrics[:8]) + (f" and {len(metrics) - 8} more"
                                              if len(metrics) > 8 else "")
    uris = sorted({shown(e["uri"]) for e in entries})
    text = (f"{len(entries)} MLflow calls did not reach mlflow.tracking_uri={', '.join(uris)}: "
            f"metrics {shown_metrics or '(none)'}; {artifacts} artifacts, {runs} runs to create. "
            f"They are kept in {run_dir / UNLOGGED}; once the store answers, send them with "
            f"`python -m workflows.replay {run_dir}`")
    return textwrap.fill(f"eyas: {text}", width=100, subsequent_indent="  ",
                         break_long_words=False, break_on_hyphens=False)


def _send(client: mlflow.MlflowClient, entry: dict, created: dict[str, str],
          experiment_id: str | None = None):
    """Make one recorded call; `created` maps refs of runs made on replay to their ids."""
    op = entry["op"]
    run = created.get(entry.get("run"), entry.get("run"))
    if op == "start_run":
        from mlflow.tracking.context.registry import resolve_tags

        tags = dict(entry["tags"])
        parent = created.get(entry.get("parent"), entry.get("parent"))
        if parent:
            tags["mlflow.parentRunId"] = parent
        if experiment_id is None:
            experiment_id = ensure_experiment(client, entry["experiment"], entry["uri"])
        return client.create_run(experiment_id, start_time=entry.get("time"),
                                 tags=resolve_tags(tags), run_name=entry["name"]).info.run_id
    if op == "end_run":
        return client.set_terminated(run, entry["status"], end_time=entry.get("time"))
    if op == "params":
        return client.log_batch(run, params=[Param(k, str(v)) for k, v in
                                             entry["params"].items()])
    if op == "tags":
        return client.log_batch(run, tags=[RunTag(k, v) for k, v in entry["tags"].items()])
    if op == "metrics":
        rows = [Metric(k, v, ts, step) for k, v, ts, step in entry["metrics"]]
        for i in range(0, len(rows), _METRIC_BATCH):
            client.log_batch(run, metrics=rows[i:i + _METRIC_BATCH])
        return None
    if op == "text":
        return client.log_text(run, entry["text"], entry["name"])
    if op == "artifact":
        return client.log_artifact(run, entry["path"], entry.get("folder"))
    raise ValueError(f"unknown MLflow call {op!r}")
