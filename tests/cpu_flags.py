"""What this machine's CPU computes natively, read from /proc/cpuinfo (not through torch, so
that a test of eyas.precision's reading has an independent answer)."""
from __future__ import annotations

import os
from pathlib import Path


def native_bf16_flags() -> bool:
    """avx512_bf16 or AMX's bfloat16 among the CPU's flags, and oneDNN not capped below them."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    from eyas.precision import NO_BF16_ISAS

    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in NO_BF16_ISAS
    return bool({"avx512_bf16", "amx_bf16"} & set(flags)) and not capped
