"""The pipeline on a Ray cluster of two nodes (Ray's own `ray.cluster_utils.Cluster`: two raylets
on this machine, each with its own resources), joined as a user's driver joins a cluster:
extraction replicas and Ray Train's workers are observed on both nodes, and a node that cannot
see a path the run needs is named before any stage starts. Nodes removed mid-extraction and
mid-training (offline), and under an online stream whose target and trainer sit on different
nodes: the run finishes, nothing finished is redone, and the same command again skips it all.

It runs in a subprocess of its own: a second Ray cluster cannot share a process with the
session's (tests/conftest.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eyas.train.report import FEEDER_REPORT_FILE

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
    from tasks.prepare import replica_threads
    from workflows.config import load_config
    out["threads"] = [replica_threads(load_config([
        "experiment=tiny", "data.generation.num_replicas=%d" % n, "serve.cpu_threads=null"]))
        for n in (1, 2, 4)]
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
    # regeneration replicas, spread one or two to a node, share its cores (this machine's)
    cores = len(os.sched_getaffinity(0))
    assert out["threads"] == [cores, cores, max(1, cores // 2)]
    on = {}
    for a in out["actors"]:
        on.setdefault(a["class"], set()).add(a["node"])
    assert on.get("ReplicaActor") == set(out["nodes"]), on  # extraction on both nodes
    assert on.get("RayTrainWorker") == set(out["nodes"]), on  # training on both nodes
    report = json.loads((run_dir / "train" / "train_report.json").read_text())
    assert report["steps"] > 0


# Nodes removed mid-run (Cluster.remove_node: the raylet and every worker on it killed, as when
# a machine is lost). A watcher thread removes the node of a live actor of class `cls` once
# `trigger` exists under the run directory; the pipeline runs in the main thread, then again.
# The actor's node is read from the process table (an actor's worker is a child of its node's
# raylet, titled "ray::CLASS"), not from Ray's state API, which answers late or fails on a busy
# machine; a watcher that fails reports why instead of dying silently.
LOST = textwrap.dedent('''
    import hashlib, json, os, sys, threading, time, traceback
    from pathlib import Path
    sys.path.insert(0, {root!r})
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    run_dir, extra = Path({run_dir!r}), {extra!r}
    cluster = Cluster(initialize_head=True, head_node_args={{
        "num_cpus": 2, "object_store_memory": 200 * 2**20}})
    workers = [cluster.add_node(num_cpus=2, object_store_memory=200 * 2**20)
               for _ in range(extra)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={{"env_vars": {{"PYTHONPATH": {root!r}}}}})
    events, failures = [], []

    def on(cls):
        nodes = {{n.all_processes["raylet"][0].process.pid: n.node_id
                 for n in [cluster.head_node, *workers]}}
        found = set()
        for p in psutil.process_iter(["cmdline", "ppid"]):
            title = (p.info["cmdline"] or [""])[0]
            if title.startswith("ray::" + cls) and p.info["ppid"] in nodes:
                found.add(nodes[p.info["ppid"]])
        return found

    def finished(folder):
        return {{p.name: [p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()]
                for p in sorted(Path(folder).glob("shard-*")) if p.is_file()}}

    def watch():
        try:
            for trigger, cls in {removals!r}:
                while not list(run_dir.glob(trigger)):
                    time.sleep(0.02)
                where = {{c: sorted(on(c)) for c in ("ReplicaActor", "RayTrainWorker")}}
                done = sorted(p.name for p in run_dir.glob(trigger))
                shards = finished(run_dir / "extract")
                victim = next((n for n in workers if n.node_id in where[cls]), None)
                if victim is not None:
                    workers.remove(victim)
                    cluster.remove_node(victim)
                events.append({{"trigger": trigger, "done": done, "on": where,
                               "shards": shards, "removed": victim and victim.node_id}})
        except BaseException:
            failures.append(traceback.format_exc())

    threading.Thread(target=watch, daemon=True).start()
    from workflows import pipeline
    out = {{"code": pipeline.main({argv!r})}}
    out["events"], out["watcher_failed"] = events, failures

    def restarts(cls):  # after the run, where an answer late costs nothing
        from ray.util.state import list_actors
        for _ in range(60):
            try:
                return [a.num_restarts for a in list_actors(
                    filters=[("class_name", "=", cls)], detail=True, limit=10000,
                    raise_on_missing_output=False)]
            except Exception:
                time.sleep(1)
        return None
    out["replica_restarts"] = restarts("ReplicaActor")
    out["shards"] = finished(run_dir / "extract")
    print("RESULT " + json.dumps(out), flush=True)
    out["again"] = pipeline.main({argv!r})
    out["shards_again"] = finished(run_dir / "extract")
    print("RESULT " + json.dumps(out), flush=True)
    ray.shutdown()
    cluster.shutdown()
''')


@contextlib.contextmanager
def _busy():
    """A CPU-bound process beside the test, as on a loaded machine (CI's, a shared node)."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spin.kill()
        spin.wait()


def _lose_nodes(tmp_path, target_cache, extra: int, removals, overrides):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    argv = ["experiment=tiny", f"run_dir={run_dir}", f"target.builtin.cache_dir={target_cache}",
            "stages=[prepare,extract,train]", "train.num_workers=2", "train.checkpoint_every=5",
            "mlflow.run_name=lost", *overrides]
    script = LOST.format(root=str(ROOT), run_dir=str(run_dir), extra=extra, removals=removals,
                         argv=argv)
    with _busy():
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=900, cwd=ROOT)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert not out["watcher_failed"], out["watcher_failed"]
    assert out["code"] == 0, done.stderr[-3000:]
    assert [e["removed"] is not None for e in out["events"]] == [True] * len(removals), out
    return run_dir, out, done.stdout + done.stderr


def test_nodes_lost_mid_extraction_and_mid_training_lose_nothing_finished(tmp_path,
                                                                          target_cache):
    # 23 train shards; the node of an extraction replica goes once the first is written, then the
    # node of a Ray Train worker once the first checkpoint is
    run_dir, out, text = _lose_nodes(
        tmp_path, target_cache, 2,
        [("extract/shard-train-*.json", "ReplicaActor"),
         ("train/checkpoints/step-*", "RayTrainWorker")],
        ["extract.num_replicas=2", "data.demo.num_train=96", "extract.samples_per_shard=4",
         "train.epochs=4"])
    mid_extract, mid_train = out["events"]
    written = [name for name in out["shards"] if name.startswith("shard-train-")
               and name.endswith(".json")]
    assert len(written) > 20 and len(mid_extract["done"]) < len(written)  # mid-extraction
    # the lost replica restarted on a live node and redid its shard in flight there (Ray's own
    # "will be retried" line is not always forwarded to the driver)
    assert max(out["replica_restarts"] or [0]) >= 1, out["replica_restarts"]
    # each shard finished when its node went is the very file it was (not written again)
    before = mid_extract["shards"]
    assert before and {k: out["shards"][k] for k in before} == before
    # training lost a worker after its first checkpoint: the group resumed from one
    report = json.loads((run_dir / "train" / "train_report.json").read_text())
    first = int(mid_train["done"][0].rsplit("-", 1)[1])
    assert report["resumed_from"] >= first > 0 and report["steps"] > report["resumed_from"]
    # the same command again recomputes nothing
    assert out["again"] == 0 and out["shards_again"] == out["shards"]
    assert "extract    | skipped" in text and "train      | skipped" in text


def test_online_states_cross_nodes_and_a_lost_trainer_node_rewinds_the_stream(tmp_path,
                                                                              target_cache):
    run_dir, out, text = _lose_nodes(
        tmp_path, target_cache, 1, [("train/checkpoints/step-*", "RayTrainWorker")],
        ["train.source=online", "extract.num_replicas=1", "train.epochs=8"])
    (lost,) = out["events"]
    # the target replica on one node streamed to a trainer on the other (the object store)
    (replica,) = lost["on"]["ReplicaActor"]
    assert set(lost["on"]["RayTrainWorker"]) - {replica}, lost["on"]
    # online: no train shard stored, the held-out split alone
    assert not list((run_dir / "extract").glob("shard-train-*"))
    assert list((run_dir / "extract").glob("shard-heldout-*"))
    report = json.loads((run_dir / "train" / "train_report.json").read_text())
    first = int(lost["done"][0].rsplit("-", 1)[1])
    assert report["resumed_from"] >= first > 0 and report["steps"] > report["resumed_from"]
    feeder = json.loads((run_dir / "train" / FEEDER_REPORT_FILE).read_text())
    assert feeder["rewinds"] >= 1
    assert "rewound" in text and out["again"] == 0
