"""Training under Ray Train: two data-parallel workers give what one worker gives."""
import json
from dataclasses import replace

import pytest
import torch

from eyas.config import DraftConfig, TrainConfig
from eyas.train.loop import read_checkpoint
from tasks.train import TrainJob, run_training

pytestmark = pytest.mark.integration


def test_two_workers_equal_one_with_the_same_global_batch(tiny_run, tmp_path):
    from eyas.run_records import target_path
    target = target_path(tiny_run)
    cfg = TrainConfig(num_workers=1, ttt_steps=2, epochs=1, batch_size=4, lr=2e-3,
                      checkpoint_every=100, seed=0)
    draft = DraftConfig(vocab_size=128)
    states = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        run_training(TrainJob(str(tiny_run / "extract"), target, str(out),
                              replace(cfg, num_workers=workers), draft, threads=1))
        ckpt = sorted((out / "checkpoints").iterdir())[-1]
        states[workers] = read_checkpoint(ckpt)["draft"]
        report = json.loads((out / "train_report.json").read_text())
        assert report["steps"] == 6 and len(report["losses"]) == 6
    for name, value in states[1].items():
        torch.testing.assert_close(states[2][name], value, rtol=1e-4, atol=1e-5, msg=name)
