"""The README a newcomer reads: short, its two commands on the first screen, every page it
links there, the configuration page generated from the schema, and CI running its test
command."""
import importlib.util
import json
import re
import sys
import subprocess
from pathlib import Path

from helpers import docs_tables

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIRST_SCREEN = 50  # lines


def _links(path: Path) -> list[str]:
    """Relative targets of markdown links [text](target), anchors dropped."""
    text = path.read_text()
    return [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+://|#|mailto:", t)]


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) < 170
    first = "\n".join(lines[:FIRST_SCREEN])
    for marker in ("pipeline-command", "test-command"):
        block = re.search(rf"<!-- {marker} -->\n```bash\n(.+)\n```", first)
        assert block, f"the {marker} block is not on the first screen"
    assert "eyas run experiment=chat run_dir=runs/chat" in first and "python -m pytest" in first


def test_the_readmes_pipeline_time_is_the_records():
    """"about N minutes" beside the pipeline command is the timed run of that very command
    (bench/first_command_bench.py, docs/records/first_command.json), not a figure typed by
    hand (its figure marker holds it to the record too: docs/scripts/tables.py)."""
    record = json.loads((ROOT / "docs" / "records" / "first_command.json").read_text())
    run = record["rows"][0]
    block = re.search(r"<!-- pipeline-command -->\n```bash\n(.+)\n```", README.read_text())
    assert run["arguments"] == [a for a in block.group(1).rsplit("eyas run", 1)[1].split()
                                if not a.startswith("run_dir=")], "the record timed another command"
    assert run["rc"] == 0 and run["env"] == {}
    prose = re.sub(r"<!-- fig: [^>]*-->([^<]*)<!-- /fig -->", r"\1", README.read_text())
    said = re.search(r"about (\d+) minutes on 2 CPU cores", prose)
    assert said and int(said.group(1)) == round(run["minutes"]), (
        f"README says {said and said.group(1)} minutes; the record measured {run['minutes']:.1f}")


def test_every_page_the_docs_link_exists():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    linked = {(page, target) for page in pages for target in _links(page) if target}
    assert {t for p, t in linked if p == README} >= {
        "docs/recipe.md", "docs/doctor.md", "docs/configuration.md", "docs/run-directory.md",
        "docs/engines.md"}
    missing = [f"{p.relative_to(ROOT)} -> {t}" for p, t in linked
               if not (p.parent / t).exists()]
    assert not missing, missing


def test_the_configuration_page_is_the_schemas():
    spec = importlib.util.spec_from_file_location(
        "configuration_page", ROOT / "docs" / "scripts" / "configuration.py")
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert text == page.render(), ("docs/configuration.md is out of date with eyas/config.py "
                                   "or conf/: run python docs/scripts/configuration.py")
    # every key of the schema has its row, with its comment
    from workflows.config import flatten, load_config
    for key in flatten(load_config([])):
        assert f"| `{key}` |" in text, key
    assert "| `serve.concurrency` | list of int | `[1, 4, 16]` | each >= 1 | requests in " in text
    assert "| `experiment=tiny` |" in text


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and "eval" in ci
    out = subprocess.run(["awk", re.search(r"awk '([^']+)'", ci).group(1), str(README)],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("python3.11 -m venv .venv") and out.endswith("python -m pytest -q")


def test_the_benchmark_tables_are_their_records():
    stale = docs_tables().refresh(check=True)
    assert not stale, ("tables differ from their records: run python docs/scripts/tables.py: "
                       f"{stale}")
    assert (ROOT / "docs" / "records").is_dir() and any((ROOT / "docs").glob("*.md"))


def test_a_table_edited_by_hand_or_a_record_changed_is_stale(tmp_path):
    import json
    import shutil
    tables = docs_tables()
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    assert tables.refresh(docs, check=True) == []
    page = docs / "recipe.md"
    page.write_text(page.read_text().replace("| 2 | 1.852", "| 2 | 1.952", 1))
    assert tables.refresh(docs, check=True) == ["recipe.md: records/k_smollm2.json (k)"]
    shutil.copy(ROOT / "docs" / "recipe.md", page)
    record = json.loads((docs / "records" / "k_smollm2.json").read_text())
    record["rows"][0]["tpot_ms"] += 5
    (docs / "records" / "k_smollm2.json").write_text(json.dumps(record))
    assert tables.refresh(docs, check=True) == ["recipe.md: records/k_smollm2.json (k)"]
    tables.refresh(docs)  # rewritten from the record
    assert "| 2 | 1.852 ± 0.073 | 0.53 / 0.32 | 29.3 |" in page.read_text()


def test_every_table_that_serves_says_whether_it_was_lossless():
    """family, k, size, recipe and runs tables: each row's lossless verdict (judged at near-ties
    where the record holds the partings, else its count of identical outputs marked not
    judged), so a parting cannot hide behind a good τ: dropping the field fails the render."""
    tables = docs_tables()
    for name, kind, count in (("family_smollm2.json", "family", "identical_outputs"),
                              ("k_smollm2.json", "k", "lossless_outputs"),
                              ("size_smollm2.json", "size", None),
                              ("peer_smollm2.json", "recipe", None),
                              ("latency_demo.json", "runs", None)):
        record = json.loads((ROOT / "docs" / "records" / name).read_text())
        header, _, *rows = tables.RENDER[kind](record).splitlines()
        heads = [c.strip() for c in header.strip("|").split("|")]
        assert any(h.endswith(tables.LOSSLESS) for h in heads), (name, heads)
        column = next(i for i, h in enumerate(heads) if h.endswith(tables.LOSSLESS))
        for line, row in zip(rows, record["rows"]):
            cell = [c.strip() for c in line.strip("|").split("|")][column]
            if count and "partings" in row:  # judged: the verdict and what it rests on
                ties = sum(p["near_tie"] for p in row["partings"])
                assert cell == (("yes" if row["lossless"] else "**no**") + f" ({row[count]} "
                                f"identical, {ties} of {len(row['partings'])} partings "
                                "near-ties)"), (name, line)
            elif count:  # a record made before the benches judged partings
                assert cell == f"not judged ({row[count]} identical)", (name, line)
        if count:  # a judged record: its verdict, and a failed one stands out
            row = dict(record["rows"][0], partings=[{"near_tie": False}], lossless=False)
            line = tables.RENDER[kind](dict(record, rows=[row])).splitlines()[2]
            assert f"**no** ({row[count]} identical, 0 of 1 partings near-ties)" in line


def test_every_plot_draws_what_its_records_hold(tmp_path, monkeypatch):
    """docs/plots/*.svg: each plot's values (its description) are its records'; a record that
    moves makes the plot stale until it is redrawn from it."""
    import importlib
    import shutil
    sys.path.insert(0, str(ROOT / "docs" / "scripts"))
    plots = importlib.import_module("plots")
    assert plots.main(["--check"]) == 0, "run python docs/scripts/plots.py"
    for name in plots.PLOTS_MADE:
        assert f"](plots/{name})" in "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    monkeypatch.setattr(plots, "DOCS", docs)
    monkeypatch.setattr(plots, "PLOTS", docs / "plots")
    record = json.loads((docs / "records" / "size_smollm2.json").read_text())
    record["rows"][1]["predicted_tau"] += 0.1
    (docs / "records" / "size_smollm2.json").write_text(json.dumps(record))
    assert plots.main(["--check"]) == 1
    plots.main([])
    assert plots.main(["--check"]) == 0
