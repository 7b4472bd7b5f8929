"""A trained draft damaged each way users reported this autumn: what vLLM does with it (booted
raw, without eyas's checks: served tau, or the error it stops with) and what eyas says (the
serve stage's preflight, or loaded-weights parity for damage done inside the engine).

    python bench/damage.py RUN_DIR [--dflash-draft DIR] [--prompts 16] [--max-new-tokens 48]
                           [--k 3] [--json PATH]

The run's draft (RUN_DIR/train/draft) is copied and damaged: a tensor removed from its
safetensors, a tensor zeroed, lm_head left out of a tied draft, max_position_embeddings cut
below the served length, `[]` ids, four ids over its three-slot fc, an id past the last layer;
and inside a booted engine (the file intact) a norm weight zeroed, as vLLM's sleep/wake left a
tied lm_head empty (vllm #52487). With --dflash-draft (e.g. RUN_DIR/families/dflash/draft):
the causal flag flipped on it. Each copy is served by vLLM as is, then shown to eyas.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from eyas.run_records import RunDir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def damaged_copy(src: Path, out: Path, config=None, weights=None) -> Path:
    """A copy of the draft `src` at `out`, its config.json and weights edited in place by
    `config(dict)` and `weights(dict of tensors)`."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, out)
    if config:
        c = json.loads((out / "config.json").read_text())
        config(c)
        (out / "config.json").write_text(json.dumps(c, indent=2))
    if weights:
        w = load_file(out / "model.safetensors")
        weights(w)
        save_file(w, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _ids(value):
    def edit(c):
        for node in (c, c.get("eagle_config") or {}):
            if "eagle_aux_hidden_state_layer_ids" in node:
                node["eagle_aux_hidden_state_layer_ids"] = value
    return edit


def _fc_tensor(w) -> str:
    return "midlayer.mlp.down_proj.weight" if "midlayer.mlp.down_proj.weight" in w else next(
        n for n in w if n.endswith("down_proj.weight"))


def cases(draft: Path, dflash: Path | None, served: int, layers: int):
    """(name, damage in words, source draft, edit kwargs or None, in-engine edit or None, k)"""
    out = [
        ("removed", "a tensor removed from the safetensors (down_proj)", draft,
         dict(weights=lambda w: w.pop(_fc_tensor(w))), None),
        ("zeroed", "a tensor zeroed in the safetensors (down_proj)", draft,
         dict(weights=lambda w: w[_fc_tensor(w)].zero_()), None),
        ("no_lm_head", "lm_head left out, config tie_word_embeddings: true", draft,
         dict(config=lambda c: c.update(tie_word_embeddings=True),
              weights=lambda w: w.pop("lm_head.weight")), None),
        ("short_positions", f"max_position_embeddings cut to 64 (served: {served} tokens)",
         draft, dict(config=lambda c: c.update(max_position_embeddings=64)), None),
        ("empty_ids", "ids written []", draft, dict(config=_ids([])), None),
        ("four_ids", "four ids over a three-slot fc", draft,
         dict(config=_ids([2, 10, 18, 27])), None),
        ("past_last", f"an id past the last layer ({layers + 1} of {layers})", draft,
         dict(config=_ids([2, 15, layers + 1])), None),
        ("held_zeroed", "the engine's copy of the final norm zeroed after loading (the file "
         "intact; vLLM sleep/wake, #52487)", draft, None,
         lambda model: model.model.norm.weight.data.zero_()),
    ]
    if dflash is not None:
        out.append(("dflash_intact", "the run's DFlash draft as trained", dflash, {}, None))
        out.append(("causal_flipped", "a non-causally trained DFlash draft stamped "
                    "dflash_config.causal: true", dflash,
                    dict(config=lambda c: c.setdefault("dflash_config", {}).update(causal=True)),
                    None))
    return out


def vllm_does(target_dir, draft_dir, k, options, prompts, max_new_tokens, in_engine=None
              ) -> dict:
    """vLLM booted with the draft as it is (no eyas check): served tau, or the error."""
    from eyas.acceptance import AcceptanceStats
    from eyas.draft.directory import read_config
    from eyas.draft.load import speculative_config
    from eyas.engines.vllm_engine import boot_llm

    spec = {**speculative_config(read_config(draft_dir)), "model": str(draft_dir),
            "num_speculative_tokens": k}
    started = time.perf_counter()
    try:
        llm = boot_llm(target_dir, options, speculative_config=spec)
    except Exception as e:  # noqa: BLE001 - what vLLM does is the measurement
        return {"vllm": "refuses to boot", "error": f"{type(e).__name__}: {str(e)[:300]}",
                "seconds": time.perf_counter() - started}
    try:
        from vllm import SamplingParams
        if in_engine is not None:
            core = llm.llm_engine.engine_core.engine_core
            in_engine(core.model_executor.driver_worker.worker.model_runner.drafter.model)
        llm.generate([{"prompt_token_ids": p} for p in prompts],
                     SamplingParams(temperature=0.0, max_tokens=max_new_tokens,
                                    ignore_eos=True), use_tqdm=False)
        acc = AcceptanceStats.from_vllm_metrics(llm.get_metrics())
        return {"vllm": "serves it", "tau": acc.tau, "drafts": acc.drafts,
                "per_position": list(acc.per_position_rate),
                "seconds": time.perf_counter() - started}
    except Exception as e:  # noqa: BLE001
        return {"vllm": "crashes serving", "error": f"{type(e).__name__}: {str(e)[:300]}",
                "seconds": time.perf_counter() - started}
    finally:
        del llm
        import gc
        gc.collect()


def eyas_says(target_dir, draft_dir, data_dir, cfg, k, in_engine=None) -> dict:
    """The serve stage's preflight on the copy; for in-engine damage, loaded-weights parity
    on an engine damaged the same way."""
    from eyas.serve.run import preflight, served_length
    if in_engine is None:
        found = preflight(target_dir, draft_dir, data_dir, "vllm", k, weigh=False,
                          served_length=served_length(data_dir, cfg))["findings"]
        return {"eyas": [f.name for f in found], "message": "; ".join(f.message
                                                                     for f in found)}
    from eyas.engines.vllm_draft_logits import drafter
    from eyas.engines.vllm_engine import VllmEngine
    from eyas.serve.loaded import loaded_parity
    from eyas.serve.parity import engine_options
    from eyas.store.reader import ExtractedDataset

    prompt = ExtractedDataset(data_dir, "probe")[0].input_ids.tolist()[:256]
    options = engine_options(len(prompt) + k + 2, cfg)
    with VllmEngine(target_dir, draft_dir, k, options) as engine:
        in_engine(drafter(engine).model)
        r = loaded_parity(engine, draft_dir, target_dir, prompt, options.dtype)
    return {"eyas": [f["name"] for f in r["findings"]], "message": r["message"]}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--dflash-draft", type=Path)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--only", help="comma-separated case names")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)

    from eyas.evaluate.measured import heldout_prompts
    from eyas.extract.on_demand import open_split
    from eyas.serve.parity import engine_options
    from eyas.serve.run import served_length
    from eyas.targets import identify
    from recipe_bench import run_settings

    run = a.run_dir.resolve()
    draft = RunDir.of(run).draft
    data = RunDir.of(run).extract
    _, _, target_dir, serve_cfg = run_settings(run)
    serve_cfg = replace(serve_cfg, num_speculative_tokens=a.k, max_new_tokens=a.max_new_tokens)
    prompts = heldout_prompts(open_split(data, "heldout", states=False), a.prompts)
    options = replace(engine_options(max(map(len, prompts)) + a.max_new_tokens + 16, serve_cfg),
                      max_num_seqs=len(prompts))
    layers = identify(target_dir).num_layers
    only = set(a.only.split(",")) if a.only else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="eyas-damage-") as tmp:
        baseline = vllm_does(target_dir, draft, a.k, options, prompts, a.max_new_tokens)
        rows.append({"case": "none", "damage": "the run's draft as trained", **baseline,
                     **eyas_says(target_dir, draft, data, serve_cfg, a.k)})
        print(f"none: tau {baseline.get('tau')}", flush=True)
        for name, words, src, edit, in_engine in cases(draft, a.dflash_draft,
                                                       served_length(data, serve_cfg), layers):
            if only and name not in only:
                continue
            k = a.k
            if src != draft:  # a DFlash draft serves its block
                block = json.loads((src / "config.json").read_text()).get("block_size")
                if block is None:  # a guess served a block of 4 with 15 drafts
                    raise SystemExit(f"{src}/config.json has no block_size: re-export the "
                                     "DFlash draft with this eyas (it writes the block it "
                                     "was trained on there, as published DFlash configs do)")
                k = int(block) - 1
            copy = damaged_copy(src, Path(tmp) / name, **edit) if edit else src
            row = {"case": name, "damage": words, "k": k,
                   **vllm_does(target_dir, copy, k, replace(options), prompts,
                               a.max_new_tokens, in_engine),
                   **eyas_says(target_dir, copy, data, replace(serve_cfg,
                                                               num_speculative_tokens=k),
                               k, in_engine)}
            rows.append(row)
            print(f"{name}: vLLM {row['vllm']} "
                  f"{'tau %.3f' % row['tau'] if 'tau' in row else row.get('error', '')[:120]}"
                  f" | eyas {row['eyas'] or 'admits'}", flush=True)
    out = {"draft": str(draft), "k": a.k, "prompts": len(prompts),
           "max_new_tokens": a.max_new_tokens, "rows": rows}
    if a.json:
        from record import engine_options_of, measured_under, provenance, write
        sides = {r["case"]: {**measured_under(prompts, a.max_new_tokens, serve_cfg.dtype,
                                              len(prompts), None, target_dir, r.get("k", a.k),
                                              engine_options=engine_options_of(serve_cfg)),
                             "damage": r["damage"]} for r in rows}
        drafts = {"run": draft, **({"dflash": a.dflash_draft} if a.dflash_draft else {})}
        write(a.json, out, provenance(argv, target_dir, drafts, prompts), sides,
              compared=("damage", "k"))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
