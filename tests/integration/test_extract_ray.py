"""Extraction on Ray: data-parallel replicas, a split replica, and a worker killed mid-run."""
import json
import os
import signal
from pathlib import Path

import pytest

from eyas.config import ExtractConfig
from eyas.extract import Extraction
from eyas.store.reader import ExtractedDataset
from eyas.targets import load_tokenizer
from tasks.extract import run_extraction

pytestmark = pytest.mark.integration


def _replica_pids() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"ray::ReplicaActor" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_killed_replica_loses_nothing_and_split_replicas_agree(tiny_run, tmp_path):
    reference = json.loads((tiny_run / "extract" / "manifest.json").read_text())
    target = json.loads((tiny_run / "prepare" / "target.json").read_text())
    layout = ExtractedDataset(tiny_run / "extract").layout
    tokenizer = load_tokenizer(target["target_path"])
    cfg = ExtractConfig(dtype=reference["dtype"], samples_per_shard=8, num_replicas=2,
                        stages_per_replica=2, probe_samples=0)
    killed = []

    def kill_one(record):
        if not killed:
            pids = _replica_pids()
            assert pids, "no replica worker found"
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    manifest = run_extraction(target["target_path"],
                              Extraction(tiny_run / "prepare", tmp_path / "x", layout, tokenizer,
                                         cfg, "float32"), on_shard=kill_one)
    assert killed
    assert manifest["totals"] == reference["totals"]
    ours = ExtractedDataset(tmp_path / "x")
    ref = ExtractedDataset(tiny_run / "extract")
    assert [ours[i].sample_id for i in range(len(ours))] == [ref[i].sample_id for i in range(len(ref))]
    import torch
    for i in range(len(ours)):
        for name in ref.layout.names:
            # the same float32 forward, split or not, rounded to the stored dtype: at most an
            # ulp apart (torch's default tolerance for that dtype), far from another block
            torch.testing.assert_close(ours[i].slots[name], ref[i].slots[name])
    assert not list((tmp_path / "x").glob(".tmp-*"))
