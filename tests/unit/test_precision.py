"""bfloat16 only where it is computed natively: target.dtype=auto and train.precision=auto
(eyas/precision.py), decided from this machine's CPU as torch and oneDNN see it."""
from workflows.config import load_config


def test_auto_dtype_is_bfloat16_only_where_the_target_computes_it_natively(monkeypatch):
    """target=smollm2 (and target=local) pick target.dtype=auto: float32 on a CPU whose matmuls
    have no bfloat16 instructions (oneDNN capped at AVX2, as on an AVX2-only EPYC), what
    /proc/cpuinfo says this CPU has otherwise; a dtype the user names is kept; GPU replicas
    compute it natively. train.precision stays auto: the trainer's device decides."""
    from cpu_flags import native_bf16_flags

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = load_config(["target=smollm2"])
    assert capped.target.dtype == capped.serve.dtype == "float32"
    assert capped.train.precision == "auto"
    assert load_config(["target=smollm2", "target.dtype=bfloat16"]).target.dtype == "bfloat16"
    assert load_config(["target=smollm2", "extract.gpus_per_replica=1"]
                       ).target.dtype == "bfloat16"
    assert load_config(["target=local", "target.path=/models/x"]).target.dtype == "float32"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    here = "bfloat16" if native_bf16_flags() else "float32"
    assert load_config(["target=smollm2"]).target.dtype == here
