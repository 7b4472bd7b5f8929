"""FP8 stored states (extract.dtype=float8_e4m3fn): each token's row scaled into float8's range,
its scale stored beside it; half bfloat16's bytes, read back in bfloat16 within float8's
rounding, the rows' norms (an embedding's few units, a layer's hundreds, an outlier's
thousands) intact."""
import pytest
import torch

from eyas.store.format import FP8, dequantize, quantize, read_rows
from eyas.store.reader import ExtractedDataset
from eyas.targets import load_tokenizer
from helpers import extract_tiny, make_tiny_target, prepare_tiny

EPS = 2.0 ** -4  # float8 e4m3's relative rounding, at most (3 mantissa bits)


def _rows():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 576, generator=g)
    rows[0] *= 2.8 / rows[0].norm()  # an embedding row (SmolLM2's slot norm)
    rows[1] *= 840 / rows[1].norm()  # a late layer's
    rows[2, 7] = 3000.0  # a massive activation
    rows[3] *= 1e-4  # tiny values: float8's subnormals flush them to 0 unscaled
    return rows


def test_scaled_rows_keep_their_values_and_norms():
    rows = _rows()
    stored = quantize({"s": rows}, FP8)
    assert stored["s"].dtype == FP8 and stored["s.scale"].shape == (6,)
    slots, scales = dequantize(stored)
    back = read_rows(slots["s"], scales["s"], 0, 6).float()
    largest = rows.abs().amax(-1, keepdim=True)
    assert ((back - rows).abs() <= EPS * largest).all()  # each element within its row's eps
    norms = back.norm(dim=-1) / rows.norm(dim=-1)
    assert ((norms - 1).abs() < 0.02).all(), norms
    # cast without the scales: the outlier saturates at 448 and the small row flushes to 0
    plain = rows.to(FP8).float()
    assert plain[2, 7] == 448 and plain[3].abs().sum() < 0.5 * rows[3].abs().sum()


def test_an_fp8_extraction_stores_half_the_bytes_and_reads_back_bfloat16(tmp_path):
    target = make_tiny_target(tmp_path / "target", "llama", layers=4, hidden=32)
    prepare_tiny(tmp_path / "prepare", load_tokenizer(target))
    bf16 = extract_tiny(target, tmp_path / "prepare", tmp_path / "bf16", dtype="bfloat16")
    fp8 = extract_tiny(target, tmp_path / "prepare", tmp_path / "fp8", dtype="float8_e4m3fn")
    assert fp8["dtype"] == "float8_e4m3fn"
    # per token and slot: H bytes and a 4-byte scale, against 2 H
    h, ratio = 32, fp8["tensor_bytes"] / bf16["tensor_bytes"]
    assert ratio == pytest.approx((h + 4) / (2 * h))
    a, b = ExtractedDataset(tmp_path / "bf16"), ExtractedDataset(tmp_path / "fp8")
    for i in range(len(a)):
        for name, want in a[i].slots.items():
            got = b[i].slots[name]
            assert got.dtype == torch.bfloat16 and got.shape == want.shape
            largest = want.float().abs().amax(-1, keepdim=True)
            assert ((got.float() - want.float()).abs() <= 2 * EPS * largest).all()
    # the norm fingerprints the doctor reads are the computed values', equal in both
    for slot, norms in a.layout.norms.items():
        assert b.layout.norms[slot].mean == pytest.approx(norms.mean, rel=0.01)
    probe = ExtractedDataset(tmp_path / "fp8", "probe")
    assert all(t.dtype == torch.bfloat16 for t in probe[0].slots.values())
