"""On a GPU machine: the HF stage on CUDA writes what it writes on CPU, and a replica split
into block ranges (on one device, and over two devices where there are two) what one stage
writes. Skipped where no accelerator is present; the two-device test says when it is skipped."""
import pytest
import torch

from eyas.extract.blocks import TargetBlocks, make_batch, run_blocks
from eyas.layout import EMBED, FINAL_NORM, Slot
from helpers import make_tiny_target

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

SLOTS = [EMBED, Slot("block_out", 1), Slot("block_out", 3), FINAL_NORM]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target = str(make_tiny_target(tmp_path_factory.mktemp("t"), "llama", layers=4, hidden=64))
    batch = make_batch([[1, 5, 9, 13, 2], [1, 7, 3]], pad_id=0)
    return target, batch, run_blocks([TargetBlocks(target, 0, 4, "cpu")], batch, SLOTS)


def _assert_same(got, want):
    for slot in SLOTS:
        torch.testing.assert_close(got[slot].cpu(), want[slot], rtol=1e-3, atol=1e-3)


def test_cuda_stage_matches_cpu(setup):
    target, batch, cpu = setup
    _assert_same(run_blocks([TargetBlocks(target, 0, 4, "cuda:0")], batch, SLOTS), cpu)


def test_split_into_two_stages_on_one_device_matches_cpu(setup):
    target, batch, cpu = setup
    stages = [TargetBlocks(target, 0, 2, "cuda:0"), TargetBlocks(target, 2, 4, "cuda:0")]
    _assert_same(run_blocks(stages, batch, SLOTS), cpu)


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="a split over two devices needs two CUDA devices")
def test_split_over_two_devices_matches_cpu(setup):
    target, batch, cpu = setup
    stages = [TargetBlocks(target, 0, 2, "cuda:0"), TargetBlocks(target, 2, 4, "cuda:1")]
    _assert_same(run_blocks(stages, batch, SLOTS), cpu)
