"""The engine and sizing tables of docs/engines.md and docs/recipe.md
(docs/scripts/vllm_boot_time.py, vllm_capture_ids.py, vllm_deepseek_ids.py, smollm2_numerics.py,
bench/cpu_size_bench.py, bench/vocab_bench.py), for docs/scripts/tables.py, which hands each its
table writer."""
from __future__ import annotations


def boot_table(record: dict, table) -> str:
    """vLLM's import and boots, in-process against its default processes."""
    names = {"in-process": "in-process, 1 thread (eyas's default)",
             "multiprocess": "`--multiprocess` (vLLM's default engine-core + worker processes)"}
    rows = [[names.get(r["engine"], r["engine"]), f"{r['import_s']:.1f} s",
             f"{r['boot_alone_s']:.1f} s", f"{r['boot_draft_s']:.1f} s",
             f"{r['peak_rss_gib']:.2f} GiB" + (", plus the engine's processes"
                                               if r["engine"] == "multiprocess" else ""),
             r["identical"]] for r in record["rows"]]
    return table(["engine", "import vllm", "boot, target alone", "boot, with draft",
                  "peak RSS of the calling process", "greedy output identical"], rows)


def numerics_table(record: dict, table) -> str:
    """vLLM's captured states against HF's, slot by slot, beside parity's predicted walk."""
    rows = [[f"`{r['slot']}`", r["blocks"], f"{r['whole']:.1e}",
             " / ".join(f"{x:.4f}" for x in r["per_token"]), f"{r['predicted_walk']:.4f}",
             f"{r['tolerance']:.3f}", f"{r['next_block']:.2f}",
             " / ".join(f"{x:.0f}" for x in r["norms"])] for r in record["rows"]["numerics"]]
    return table(["slot", "blocks", "whole tensor", "per token: median / mean / max",
                  "bf16 walk predicted", "parity's tolerance", "next block, per token (mean)",
                  "token norms: median / max"], rows)


def cpu_size_table(record: dict, table) -> str:
    """bench/cpu_size_bench.py: per random target, a speculative round against a plain step
    at concurrency 1, and the acceptance length a draft needs for a ratio of 0.8."""
    rows = [[" × ".join(r["size"].split("x")), f"{r['parameters'] / 1e6:.1f}M",
             f"{r['plain_ms']:.2f}", f"{r['round_ms']:.2f}", f"{r['round_per_plain']:.2f}",
             f"{r['tau_for_0_8']:.2f}"] for r in record["rows"]]
    return table(["target (blocks × hidden)", "parameters", "plain ms per token",
                  "ms per round (k drafted + verify)", "round / plain step",
                  "τ needed for 0.8"], rows)


def vocab_table(record: dict, table) -> str:
    """bench/vocab_bench.py: held-out coverage of the N most frequent training answer tokens,
    and the draft head's size against the target's, one column per N."""
    out = record["rows"]
    head = out["hidden"] * out["vocab"] / 1e6
    return table(["draft vocabulary", *[str(r["draft_vocab"]) for r in out["rows"]]], [
        ["held-out coverage", *[f"{r['coverage']:.3f}" for r in out["rows"]]],
        [f"lm_head, share of the full one ({head:.1f}M)",
         *[f"{r['lm_head_share']:.2f}" for r in out["rows"]]]])


def capture_table(record: dict, table) -> str:
    """docs/scripts/vllm_capture_ids.py: per vLLM aux id, the HF tensor it matches."""
    rows = [[r["id"], f"`{r['slot']}`", r["closest"], f"{r['max_diff']:.1e}",
             f"{r['next_closest']:.1e}"] for r in record["rows"]["ids"]]
    return table(["vLLM id", "eyas slot", "closest HF tensor", "max abs difference",
                  "next closest's"], rows)


def deepseek_capture_table(record: dict, table) -> str:
    """docs/scripts/vllm_deepseek_ids.py: per column of the captured tensor, ids written
    (3, 1), the HF hidden_states index it matches."""
    rows = [[c["column"], f"HF hidden_states[{c['closest']}]", f"{c['max_diff']:.1e}",
             f"{c['others_min']:.1e}"] for c in record["rows"]["columns"]]
    return table(["column of the capture", "closest", "max abs difference",
                  "the others' least"], rows)
