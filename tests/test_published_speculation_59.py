"""Issue 59, item 4: the published measurements ship with a source and a date per row, checked
on reading, and the results page says what they hold."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.measured.published_speculation import DRAFTER_FAMILIES, PUBLISHED, read_published

PAGE = Path(__file__).resolve().parent.parent / "docs" / "results" / "published-speculation.md"


def test_every_shipped_row_has_its_gpu_source_date_and_a_measurement():
    rows = read_published()
    assert len(rows) >= 100 and set(rows["drafter"]) == set(DRAFTER_FAMILIES)
    assert rows["source_url"].str.startswith("https://").all()
    # both the latency regime (batch 1) and the serving one (batch > 1) are there
    assert (rows["batch"] == 1).sum() >= 40 and (rows["batch"] > 1).sum() >= 20


def test_the_results_page_counts_what_the_file_holds():
    rows = read_published()
    table = dict(re.findall(r"^\| (\w+) \| (\d+ \| \d+ \| \d+) \|$", PAGE.read_text(), re.M))
    for family in (*DRAFTER_FAMILIES, "all"):
        part = rows if family == "all" else rows[rows["drafter"] == family]
        counted = f"{len(part)} | {int((part['batch'] == 1).sum())} | {int((part['batch'] > 1).sum())}"
        assert table[family] == counted, family


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("drafter", "lookahead", "drafter 'lookahead' is none of medusa, eagle"),
        ("source_date", "April 2025", "source_date 'April 2025' is not YYYY-MM"),
        ("batch", "one", "batch 'one' not a number"),
        ("source_url", "", "every row names its GPU and its source's URL"),
    ],
)
def test_a_bad_row_is_refused_naming_its_row(tmp_path, column, value, message):
    with PUBLISHED.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rows[7][column] = value
    bad = tmp_path / "published.csv"
    with bad.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(PerfkitError, match=rf"published.csv row 9: {message}"):
        read_published(bad)
