"""The Ray Data against prepare's task pool table (bench/prepare_ray_data_bench.py), for
docs/scripts/tables.py."""
from __future__ import annotations

MIB = 2 ** 20


def ray_data_table(record: dict, table) -> str:
    """Per timed round: each side's seconds, Ray Data's over the pool's, each side's seat
    process's memory growth; then the median ratio with the rounds' min-max."""
    rows = record["rows"]
    out = []
    for i, r in enumerate(rows["rounds"], 1):
        pool, data = r["pool"], r["ray_data"]
        out.append([i, f"{pool['seconds']:.2f}", f"{data['seconds']:.2f}",
                    f"{data['seconds'] / pool['seconds']:.3f}",
                    f"{pool['rss_growth'] / MIB:.0f} / {data['rss_growth'] / MIB:.0f}"])
    low, high = rows["ratio_interval"]
    out.append(["median (min–max)", "", "", f"**{rows['ratio']:.3f}** ({low:.3f}–{high:.3f})",
                ""])
    skipped = sum(rows["skipped"].values())
    files = "byte-identical" if rows["same_bytes"] else "the same rows, other bytes"
    head = [f"round ({rows['conversations']:,} conversations, {rows['tokens'] / 1e6:.2f}M "
            f"tokens, {skipped} skipped; the two files {files})", "pool (s)", "Ray Data (s)",
            "Ray Data / pool", "seat's memory growth, pool / Ray Data (MiB)"]
    return table(head, out)


def regenerate_ray_data_table(record: dict, table) -> str:
    """Per alternated round: each side's seconds for the same conversations (boots included),
    its generation rounds, answers and tokens, Ray Data's seconds over the replicas', and how
    many conversations came out the same on both sides."""
    rows = record["rows"]
    same = {s["round"]: s for s in rows["same"]}
    by_round: dict[int, dict] = {}
    for r in rows["rows"]:
        by_round.setdefault(r["round"], {})[r["side"]] = r
    out = []
    for n, sides in sorted(by_round.items()):
        rep, data = sides["replicas"], sides["ray-data"]
        out.append([n, f"{rep['seconds']:.1f}", f"{data['seconds']:.1f}",
                    f"{data['seconds'] / rep['seconds']:.2f}", rep["generation_rounds"],
                    f"{rep['answers']} / {rep['tokens']:,}",
                    f"{data['answers']} / {data['tokens']:,}",
                    f"{same[n]['same']} of {same[n]['conversations']}"])
    low, high = rows["ratio_range"]
    out.append(["median (min–max)", "", "", f"**{rows['ratio']:.2f}** ({low:.2f}–{high:.2f})",
                "", "", "", ""])
    return table([f"round ({rows['conversations']} conversations, {rows['replicas']} engines "
                  "a side)", "replicas (s)", "Ray Data (s)", "Ray Data / replicas",
                  "generation rounds", "answers / tokens, replicas",
                  "answers / tokens, Ray Data", "conversations the same"], out)
