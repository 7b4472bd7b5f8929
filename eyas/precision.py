"""bfloat16 only where the hardware computes it: the `auto` of target.dtype and train.precision.

A bfloat16 forward runs about 3x float32 on a CPU with AMX, while on a CPU without native
bfloat16 instructions (no avx512_bf16, no AMX: an AVX2-only EPYC, most laptops) a bfloat16
matmul is emulated and runs tens of times slower than float32 (docs/engines.md, measured by
bench/dtype_bench.py). So `auto` picks bfloat16 on GPUs that have it and on CPUs with AMX or
avx512_bf16, float32 elsewhere; a dtype a user names is always kept, with a warning where it
will be slow.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class Bf16Support:
    native: bool
    where: str  # what computes it, in words: "CPU with AMX", "CPU without ... (AVX2)"


# oneDNN instruction sets (ONEDNN_MAX_CPU_ISA) below which its matmuls have no bfloat16
# instructions: capped so, a CPU with AMX runs a bfloat16 matmul emulated, ~70x slower than
# float32 (bench/dtype_bench.py)
NO_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                "AVX512_CORE_VNNI")


def cpu_bf16() -> Bf16Support:
    """Whether this machine's CPU computes bfloat16 matmuls natively: AMX tiles or avx512_bf16
    (as torch sees the CPU), and oneDNN, which runs torch's CPU matmuls, not capped below
    them by ONEDNN_MAX_CPU_ISA."""
    import torch

    cpu = torch.cpu
    capability = torch.backends.cpu.get_cpu_capability()
    has = ("AMX" if cpu._is_amx_tile_supported() else
           "avx512_bf16" if cpu._is_avx512_bf16_supported() else None)
    if has is None:
        return Bf16Support(False, f"CPU without avx512_bf16 or AMX ({capability})")
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "")
    if isa.upper() in NO_BF16_ISAS:
        return Bf16Support(False, f"CPU with {has} (its matmuls capped at {isa} by "
                                  "ONEDNN_MAX_CPU_ISA)")
    return Bf16Support(True, f"CPU with {has}")


def gpu_bf16() -> Bf16Support:
    """This machine's GPU; where it has none to ask (a driver on a CPU head node deciding for
    its GPU replicas), GPUs are taken to compute bfloat16 natively, as every one since Ampere
    does."""
    import torch

    if not torch.cuda.is_available():
        return Bf16Support(True, "GPU replicas")
    name = torch.cuda.get_device_name()
    return Bf16Support(bool(torch.cuda.is_bf16_supported()), f"GPU {name}")


def support(on_gpu: bool = False) -> Bf16Support:
    return gpu_bf16() if on_gpu else cpu_bf16()


def pick(requested: str, where: Bf16Support) -> str:
    """The dtype to compute in: `requested` itself unless it is `auto`, which is bfloat16
    where the device computes it natively and float32 elsewhere."""
    if requested != AUTO:
        return requested
    return "bfloat16" if where.native else "float32"


def describe(key: str, dtype: str, where: Bf16Support) -> str:
    """The summary's words for one key: what it computes in, and why (the same words whether
    `auto` chose it or a user did)."""
    if where.native:
        auto = "" if dtype == "bfloat16" else f"; {key}=auto picks bfloat16"
        return f"{key} {dtype} (this {where.where} computes bfloat16 natively{auto})"
    if dtype != "bfloat16":
        return (f"{key} {dtype}: this {where.where} has no native bfloat16, where a bfloat16 "
                f"matmul runs tens of times slower than float32, so {key}=auto picks float32")
    return (f"{key} bfloat16 as set, though this {where.where} has no native bfloat16: expect "
            f"it tens of times slower than float32 ({key}=auto picks float32 here)")
