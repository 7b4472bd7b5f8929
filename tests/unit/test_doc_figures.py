"""Figures quoted in the docs' prose are their records': a figure that a record in docs/records/
holds sits between `<!-- fig: RECORD EXPRESSION SPEC -->` and `<!-- /fig -->`, written by
docs/scripts/tables.py from the record (its docstring has the syntax), and `--check`
(test_docs.py's test_the_benchmark_tables_are_their_records) refuses one that differs. No
sentence can excuse a typed figure by calling it unrecorded: every figure has a record."""
import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import docs_tables

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
TABLE = re.compile(r"<!-- table: .*?<!-- end table -->", re.S)
FIGURE = re.compile(r"(?<!`)<!-- fig: (\S+) [^>\n]*-->[^<\n]*<!-- /fig -->")
CODE = re.compile(r"`[^`\n]*`")
RECORD = re.compile(r"records/[\w.+-]+\.json")
# a decimal quoted as a measurement: after τ, tau or ratio; before x (a speed-up) or minutes
QUOTED = re.compile(r"(?:τ|\btau|\bratios?)(?:\s+(?:of|about|at|is|was))?\s+(\d+\.\d+)"
                    r"|\b(\d+\.\d+)(?:x\b|\s*min(?:utes)?\b)")


def hand_typed(text: str) -> list[str]:
    """Decimals quoted as measurements (QUOTED) outside figure markers, code and generated
    tables, in a paragraph that names a record (a link, or a figure marker's) or follows a
    generated table in its section. A heuristic: narrow on purpose."""
    text = TABLE.sub("GENERATED TABLE", FIGURE.sub(r"FIGURE(\1)", FENCE.sub("", text)))
    found, after_table = [], False
    for block in re.split(r"\n\s*\n", text):
        if any(line.startswith("#") for line in block.splitlines()):
            after_table = False  # a heading starts another section
        if block.strip() == "GENERATED TABLE":
            after_table = True
            continue
        if not (after_table or RECORD.search(block)):
            continue
        for sentence in re.split(r"(?<=[.;:])\s+", CODE.sub("CODE", block)):
            found += [f"{m.group(0)!r} in {' '.join(sentence.split())[:160]!r}"
                      for m in QUOTED.finditer(sentence)]
    return found


def test_no_figure_beside_a_record_is_typed_by_hand():
    typed = {page.relative_to(ROOT).as_posix(): hand_typed(page.read_text()) for page in PAGES}
    assert not {page: found for page, found in typed.items() if found}, (
        "figures typed by hand beside a record: put each in a <!-- fig: --> marker "
        "(docs/scripts/tables.py), from its record")


@pytest.mark.parametrize("page, anchor", [
    ("docs/recipe.md", "[`records/peer_speed_smollm2.json`](records/peer_speed_smollm2.json))."),
    ("docs/families.md", "**No family pays on this budget.**"),  # in the section after a table
    ("README.md", "minutes on 2 CPU cores"),  # beside a figure from a record
])
def test_a_figure_typed_back_by_hand_is_found(page, anchor):
    text = (ROOT / page).read_text()
    assert text.count(anchor) == 1 and not hand_typed(text)
    typed = text.replace(anchor, anchor + " It served τ 1.99, 1.2x faster. ")
    assert [f.split(" in ")[0] for f in hand_typed(typed)] == ["'τ 1.99'", "'1.2x'"]


def test_calling_a_typed_figure_unrecorded_does_not_excuse_it():
    anchor = "**No family pays on this budget.**"
    page = (ROOT / "docs" / "families.md").read_text()
    assert page.count(anchor) == 1 and not hand_typed(page)
    typed = page.replace(anchor, anchor + " It served τ 1.99 (not recorded). ")
    assert [f.split(" in ")[0] for f in hand_typed(typed)] == ["'τ 1.99'"]


def test_a_figure_is_stale_when_its_record_changes_or_it_is_edited(tmp_path):
    tables = docs_tables()
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    assert tables.refresh(docs, check=True) == []
    page, name = docs / "recipe.md", "records/peer_speed_smollm2.json"
    marker = f"<!-- fig: {name} rows.ratio_speculators .2f -->"
    assert f"{marker}2.12<!-- /fig -->x speculators'" in page.read_text()
    stale = [f"recipe.md: {name} rows.ratio_speculators (figure '2.12', its record '2.50')"]

    def followed(found):  # the figure followed here, not the others computed from the field
        return [s for s in found if s.startswith(f"recipe.md: {name} rows.ratio_speculators (")]

    record = json.loads((docs / name).read_text())
    record["rows"]["ratio_speculators"] = 2.5  # the record changed
    (docs / name).write_text(json.dumps(record))
    assert followed(tables.refresh(docs, check=True)) == stale
    tables.refresh(docs)  # rewritten from the record
    assert f"{marker}2.50<!-- /fig -->x speculators'" in page.read_text()
    assert tables.refresh(docs, check=True) == []
    page.write_text(page.read_text().replace(f"{marker}2.50", f"{marker}2.12"))  # by hand
    assert tables.refresh(docs, check=True) == stale  # the other pages were rewritten


@pytest.mark.parametrize("path, why", [("rows.ratoi_speculators", "no 'ratoi_speculators'"),
                                        ("rows.rows.7.eyas_tokens_per_s", "no '7'"),
                                        ("rows.ratio_speculators.0", "no '0'")])
def test_a_path_not_in_its_record_names_the_page_the_marker_and_the_path(tmp_path, path, why):
    tables = docs_tables()
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    page, name = docs / "recipe.md", "records/peer_speed_smollm2.json"
    marker = f"<!-- fig: {name} rows.ratio_speculators .2f -->"
    page.write_text(page.read_text().replace(marker, marker.replace("rows.ratio_speculators",
                                                                    path)))
    with pytest.raises(SystemExit) as refused:
        tables.refresh(docs, check=True)
    said = str(refused.value)
    assert said.startswith(f"{page}: <!-- fig: {name} {path} .2f -->: "), said
    assert f"the path {path!r} is not in {name} ({why} there)" in said


def test_a_marker_that_is_not_whole_is_refused(tmp_path):
    tables = docs_tables()
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    page = docs / "recipe.md"
    page.write_text(page.read_text().replace("rows.ratio_speculators .2f -->2.12<!-- /fig -->",
                                             "rows.ratio_speculators .2f -->2.12", 1))
    with pytest.raises(SystemExit, match="recipe.md: a `<!-- fig:` marker is not"):
        tables.refresh(docs, check=True)


def test_a_figure_folds_every_element_of_a_list_and_refuses_an_unknown_fold(tmp_path):
    tables = docs_tables()
    (tmp_path / "r.json").write_text(json.dumps(
        {"rows": [{"partings": [{"gap": 0.2}, {"gap": 0.05}, {"gap": 0.31}]}]}))
    page = tmp_path / "page.md"

    def fig(expression, spec=".2f"):
        return tables.figure(page, "m", "r.json", expression, spec, {})

    assert fig("max:rows.0.partings.*.gap") == "0.31"
    assert fig("min:rows.0.partings.*.gap * -1") == "-0.05"
    assert fig("len:rows.0.partings", "d") == "3"
    assert fig("len:rows.0.partings.*.gap + 1", ".0f") == "4"
    with pytest.raises(SystemExit, match="'mean' in 'mean:rows.0.partings.*.gap' is none of"):
        fig("mean:rows.0.partings.*.gap")
    with pytest.raises(SystemExit, match="no 'gpa' there"):
        fig("max:rows.0.partings.*.gpa")
