"""User pages say what, how and which knob; dated runs live in benchmarks/RESULTS.md."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent
USER_PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
DATED_HEADING = re.compile(r"^#+ .*\b20\d\d-\d\d-\d\d\b", re.MULTILINE)


def table_cells(text: str) -> list[str]:
    """Every cell of every Markdown table row in ``text``, stripped."""
    return [
        cell.strip()
        for line in text.splitlines()
        if line.startswith("|")
        for cell in line.strip().strip("|").split("|")
    ]


def test_table_cells_finds_each_cell() -> None:
    assert table_cells("text\n| a | b b |\n|---|---:|\n") == ["a", "b b", "---", "---:"]


def test_no_readme_table_cell_is_longer_than_250_characters() -> None:
    cells = table_cells((ROOT / "README.md").read_text(encoding="utf-8"))
    assert cells, "the README has no table"
    long = [cell[:60] + "..." for cell in cells if len(cell) > 250]
    assert not long, f"README table cells over 250 characters: {long}"


@pytest.mark.parametrize("page", ["process.md", "performance.md"])
def test_the_backend_and_performance_pages_stay_short(page: str) -> None:
    lines = (ROOT / "docs" / page).read_text(encoding="utf-8").count("\n")
    assert lines < 300, f"docs/{page} has {lines} lines: move runs to benchmarks/RESULTS.md"


@pytest.mark.parametrize("path", USER_PAGES, ids=lambda path: path.name)
def test_user_pages_hold_no_dated_run(path: pathlib.Path) -> None:
    dated = DATED_HEADING.findall(path.read_text(encoding="utf-8"))
    assert not dated, f"{path.name}: dated sections belong in benchmarks/RESULTS.md: {dated}"


def test_results_are_newest_first() -> None:
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    dates = re.findall(r"^## (20\d\d-\d\d-\d\d)", text, re.MULTILINE)
    assert dates, "benchmarks/RESULTS.md has no dated run"
    assert dates == sorted(dates, reverse=True)
