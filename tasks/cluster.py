"""The Ray cluster a run is on: its nodes, where replicas go, and what every node must see.

On one node nothing changes. On several, the stage actors (extraction and regeneration
replicas) are spread over the nodes and Ray Train's workers placed SPREAD, and before any stage
each node proves it sees the run directory and the target (storage every node mounts): a task
pinned to each node reads a marker the driver wrote, and a node that cannot names itself and
the path.
"""
from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import ray


class StorageNotShared(RuntimeError):
    """A node of the cluster cannot see a path the run needs."""


def cpu_nodes() -> list[dict]:
    """The alive nodes that offer CPUs (ray.nodes() entries)."""
    return [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]


def multi_node() -> bool:
    return len(cpu_nodes()) > 1


def spread() -> dict:
    """Actor options that spread replicas over the nodes when there are several."""
    return {"scheduling_strategy": "SPREAD"} if multi_node() else {}


def on_this_node() -> dict:
    """Actor options that keep an actor on the caller's node (the driver's): what must outlive
    any other node (the online stream's Feeder, owner of the states in flight) goes there."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)}


def placement() -> str:
    """Ray Train's placement strategy: workers on different nodes when there are several."""
    return "SPREAD" if multi_node() else "PACK"


@ray.remote(num_cpus=0)
def _sees(paths: list[str], marker: str, token: str) -> dict:
    """On one node: which of `paths` it cannot see, and whether it reads the driver's marker."""
    missing = [p for p in paths if not Path(p).exists()]
    try:
        seen = Path(marker).read_text() == token
    except OSError:
        seen = False
    return {"host": socket.gethostname(), "missing": missing, "marker": seen}


def check_shared(run_dir: Path, paths: list[str | os.PathLike]) -> list[dict]:
    """Every CPU node sees `run_dir` (a marker written there now is readable on it) and each
    of `paths`; StorageNotShared naming each node and path otherwise. Returns what each node
    reported (one entry per node), [] on a single node (nothing to prove)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = cpu_nodes()
    if len(nodes) < 2:
        return []
    token = uuid.uuid4().hex
    marker = Path(run_dir) / f".eyas-node-check-{token[:8]}"
    marker.write_text(token)
    try:
        wanted = [str(Path(p).expanduser()) for p in paths]
        refs = [_sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote(wanted, str(marker), token) for n in nodes]
        seen = ray.get(refs, timeout=120)
    finally:
        marker.unlink(missing_ok=True)
    problems = []
    for node, report in zip(nodes, seen):
        where = f"node {node['NodeManagerAddress']} ({node['NodeID'][:12]})"
        if not report["marker"]:
            problems.append(f"{where} does not see the run directory {run_dir} (a file written "
                            "there by the driver is not readable on it)")
        problems += [f"{where} does not see {p}" for p in report["missing"]]
    if problems:
        raise StorageNotShared(
            "every node of the cluster must see the run directory and the target (storage all "
            "nodes mount, e.g. NFS or a cloud bucket mounted at the same path): "
            + "; ".join(problems))
    return [{"node": n["NodeID"], "address": n["NodeManagerAddress"], **r}
            for n, r in zip(nodes, seen)]
