"""On a GPU machine: the HF stage on CUDA writes what it writes on CPU, and a replica split
over two GPUs what one GPU writes. Skipped where no accelerator is present."""
import pytest
import torch

from eyas.extract.stage import TargetStage, make_batch, run_stages
from eyas.layout import EMBED, FINAL_NORM, Slot
from helpers import make_tiny_target

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def test_cuda_stages_match_cpu(tmp_path):
    target = str(make_tiny_target(tmp_path / "t", "llama", layers=4, hidden=64))
    slots = [EMBED, Slot("block_out", 1), Slot("block_out", 3), FINAL_NORM]
    batch = make_batch([[1, 5, 9, 13, 2], [1, 7, 3]], pad_id=0)
    cpu = run_stages([TargetStage(target, 0, 4, "cpu")], batch, slots)
    gpus = min(2, torch.cuda.device_count())
    split = [(0, 2), (2, 4)] if gpus == 2 else [(0, 4)]
    cuda = run_stages([TargetStage(target, s, e, f"cuda:{i}") for i, (s, e) in enumerate(split)],
                      batch, slots)
    for slot in slots:
        torch.testing.assert_close(cuda[slot], cpu[slot], rtol=1e-3, atol=1e-3)
