"""Replay: send the MLflow calls a run could not log (kept in RUN_DIR/mlflow_unlogged.jsonl by
workflows/tracking.py while the store did not answer) once the store is back.

    python -m workflows.replay RUN_DIR [TRACKING_URI]
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import mlflow

from workflows.config import ConfigError
from workflows.tracking import (UNLOGGED, TrackingUnavailable, _read_unlogged, _reason, _send,
                                open_store, shown)


def replay(run_dir: Path, tracking_uri: str | None = None) -> tuple[int, Path]:
    """Send the calls kept in RUN_DIR/mlflow_unlogged.jsonl, in order, to the store each was
    meant for (or `tracking_uri`); the file is then renamed `.replayed-<time>.jsonl`. Stopped by
    a failure, the file keeps the calls not sent (runs already created named by their ids)."""
    from workflows.run_dir import RunDirLock

    path = run_dir / UNLOGGED
    with RunDirLock(run_dir):  # no run of this directory appends meanwhile
        entries = _read_unlogged(path)
        if not entries:
            raise ConfigError(f"{path}: nothing to replay (no such file, or empty)")
        created: dict[str, str] = {}
        clients: dict[str, mlflow.MlflowClient] = {}
        for i, entry in enumerate(entries):
            uri = tracking_uri or entry["uri"]
            try:
                if uri not in clients:
                    open_store(uri, entry["experiment"])  # reached, written, safe to create
                    clients[uri] = mlflow.MlflowClient(uri)
                result = _send(clients[uri], {**entry, "uri": uri}, created)
            except Exception as e:
                rest = [{**e2, **{k: created.get(e2.get(k), e2.get(k))
                                  for k in ("run", "parent") if k in e2}}
                        for e2 in entries[i:]]
                path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rest))
                if isinstance(e, TrackingUnavailable):
                    raise
                raise TrackingUnavailable(
                    f"replaying {path}: call {i + 1} of {len(entries)} ({entry['op']}) failed "
                    f"against {shown(uri)} ({_reason(e)}); {i} sent, the rest stay in the file: "
                    "check the store and replay again") from e
            if entry["op"] == "start_run":
                created[entry["run"]] = result
        done = path.with_name(f"mlflow_unlogged.replayed-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
        path.rename(done)
        return len(entries), done


PROG = "python -m workflows.replay"  # `eyas replay` names itself here


def main(argv: list[str] | None = None) -> int:
    """`python -m workflows.replay RUN_DIR [TRACKING_URI]`."""
    from workflows.errors import debug_requested, explain

    debug, argv = debug_requested(sys.argv[1:] if argv is None else argv)
    asked = bool({"-h", "--help"} & set(argv))
    if asked or len(argv) not in (1, 2):
        print(f"usage: {PROG} RUN_DIR [TRACKING_URI]\n"
              "  sends the MLflow calls a run kept in RUN_DIR/mlflow_unlogged.jsonl (to the "
              "store they were meant for, or TRACKING_URI)",
              file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    try:
        sent, done = replay(Path(argv[0]).absolute(), argv[1] if len(argv) == 2 else None)
    except Exception as e:  # noqa: BLE001 - eyas's own errors are explained
        return explain(e, debug)
    print(f"eyas: sent {sent} MLflow calls; the file is kept as {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
