"""The docs' plots, drawn from the records the benchmarks wrote, as the tables are (tables.py).

    python docs/scripts/plots.py           # redraw every plot under docs/plots/
    python docs/scripts/plots.py --check   # exit 1 naming each plot whose data is not its records'

A plot is an SVG whose description (its `dc:description` metadata) holds, as JSON, every value
it draws, read from its records. --check recomputes those values from the records and compares
them with the description, not the drawing's bytes (which vary with matplotlib's version and
fonts), so a plot cannot show what its records do not hold (tests/unit/test_docs.py runs it).
A page shows a plot with an ordinary image link: `![...](plots/NAME.svg)`.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
PLOTS = DOCS / "plots"


def _load(name: str) -> dict | None:
    path = DOCS / "records" / name
    return json.loads(path.read_text()) if path.exists() else None


def _size_series(record: dict) -> dict:
    """A size record's curve: per size, the predicted τ, the served held-out τ and its
    interval, the accuracy at the first position."""
    rows = record["rows"]
    return {"samples": [r["samples"] for r in rows],
            "predicted_tau": [round(r["predicted_tau"], 4) for r in rows],
            "served_tau": [round(r["heldout"]["served_tau"], 4) for r in rows],
            "served_low": [round(r["heldout"]["served_tau_interval"][0], 4) for r in rows],
            "served_high": [round(r["heldout"]["served_tau_interval"][1], 4) for r in rows],
            "accuracy_d0": [round(r["in_vocab"][0], 4) for r in rows]}


# the size records a curve is drawn from, and its label (a record not there yet: no curve)
SIZE_CURVES = (("size_smollm2.json", "EAGLE-3, 1 epoch"),
               ("size_dflash_smollm2.json", "DFlash (block 4), 1 epoch"),
               ("size_dflash_epochs4_smollm2.json", "DFlash (block 4), 4 epochs"))


def size_data() -> dict:
    """Acceptance against the number of training conversations, one curve per family."""
    return {label: {"record": name, **_size_series(rec)} for name, label in SIZE_CURVES
            if (rec := _load(name)) is not None}


def size_draw(data: dict, ax) -> None:
    for i, (label, s) in enumerate(data.items()):
        color = f"C{i}"
        low = [t - lo for t, lo in zip(s["served_tau"], s["served_low"])]
        high = [hi - t for t, hi in zip(s["served_tau"], s["served_high"])]
        ax.errorbar(s["samples"], s["served_tau"], yerr=[low, high], color=color, marker="o",
                    capsize=3, label=f"{label}: served τ (95 %)")
        ax.plot(s["samples"], s["predicted_tau"], color=color, linestyle="--", marker="x",
                label=f"{label}: predicted τ")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({n for s in data.values() for n in s["samples"]}))
    ax.get_xaxis().set_major_formatter("{x:.0f}")
    ax.set_xlabel("training conversations (regenerated ShareGPT)")
    ax.set_ylabel("τ on held-out ShareGPT (tokens per target pass)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


PLOTS_MADE = {"size_tau.svg": ("τ against training data, SmolLM2-135M-Instruct",
                               size_data, size_draw)}


def draw(name: str) -> tuple[dict, bytes]:
    """(the values plot `name` draws, its SVG)."""
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, data_of, draw_on = PLOTS_MADE[name]
    data = data_of()
    plt.rcParams.update({"svg.hashsalt": "eyas", "svg.fonttype": "none"})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    draw_on(data, ax)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Description": json.dumps(
        data, sort_keys=True)})
    plt.close(fig)
    return data, out.getvalue()


def drawn_data(path: Path) -> dict | None:
    """The values a plot's SVG says it draws (its description), None where it has none."""
    import html

    m = re.search(r"<dc:description>(.*?)</dc:description>", path.read_text(), re.S)
    return json.loads(html.unescape(m.group(1))) if m else None


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, (_, data_of, _) in PLOTS_MADE.items():
        path = PLOTS / name
        if check:
            if not path.exists() or drawn_data(path) != json.loads(json.dumps(data_of())):
                stale.append(name)
            continue
        PLOTS.mkdir(exist_ok=True)
        path.write_bytes(draw(name)[1])
        print(f"wrote {path}")
    if stale:
        print(f"plots that differ from their records: {', '.join(stale)}: run python "
              "docs/scripts/plots.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
