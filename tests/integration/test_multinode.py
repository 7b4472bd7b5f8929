"""The pipeline on a Ray cluster of two nodes (Ray's own `ray.cluster_utils.Cluster`: two raylets
on this machine, each with its own resources), joined as a user's driver joins a cluster:
extraction replicas and Ray Train's workers are observed on both nodes, and a node that cannot
see a path the run needs is named before any stage starts.

It runs in a subprocess of its own: a second Ray cluster cannot share a process with the
session's (tests/conftest.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, os, sys
    sys.path.insert(0, {root!r})
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={{
        "num_cpus": 2, "object_store_memory": 200 * 2**20, "include_dashboard": True,
        "dashboard_port": None}})
    cluster.add_node(num_cpus=2, object_store_memory=200 * 2**20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={{"env_vars": {{"PYTHONPATH": {root!r}}}}})
    from tasks.cluster import StorageNotShared, check_shared
    out = {{"nodes": [n["NodeID"] for n in ray.nodes() if n["Alive"]]}}
    try:
        check_shared({run_dir!r}, ["/no/such/mount/targets"])
    except StorageNotShared as e:
        out["refused"] = str(e)
    from workflows import pipeline
    out["code"] = pipeline.main({argv!r})
    from ray.util.state import list_actors
    actors = list_actors(detail=True, limit=10000, raise_on_missing_output=False)
    out["actors"] = [{{"class": a.class_name, "node": a.node_id}} for a in actors]
    print("RESULT " + json.dumps(out), flush=True)
    ray.shutdown()
    cluster.shutdown()
''')


def test_the_pipeline_spreads_over_two_nodes(tmp_path, target_cache):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    argv = ["experiment=tiny", f"run_dir={run_dir}", f"target.builtin.cache_dir={target_cache}",
            "stages=[prepare,extract,train]", "extract.num_replicas=2", "train.num_workers=2",
            "mlflow.run_name=multinode"]
    script = SCRIPT.format(root=str(ROOT), run_dir=str(run_dir), argv=argv)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert len(out["nodes"]) == 2
    # a path no node sees: each node named, with the path
    assert out["refused"].count("does not see /no/such/mount/targets") == 2
    assert all(n[:12] in out["refused"] for n in out["nodes"])
    assert out["code"] == 0, done.stderr[-3000:]
    assert "cluster: 2 nodes, each sees" in done.stderr
    on = {}
    for a in out["actors"]:
        on.setdefault(a["class"], set()).add(a["node"])
    assert on.get("ReplicaActor") == set(out["nodes"]), on  # extraction on both nodes
    assert on.get("RayTrainWorker") == set(out["nodes"]), on  # training on both nodes
    report = json.loads((run_dir / "train" / "train_report.json").read_text())
    assert report["steps"] > 0
