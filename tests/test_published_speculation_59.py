"""Issue 59, item 4: the published measurements ship with a source and a date per row, checked
on reading, and the results page says what they hold."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pandas as pd
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


def shipped_rows() -> list[dict]:
    with PUBLISHED.open(newline="") as f:
        return list(csv.DictReader(f))


def written(rows: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


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
    rows = shipped_rows()
    rows[7][column] = value
    bad = written(rows, tmp_path / "published.csv")
    with pytest.raises(PerfkitError, match=rf"published.csv row 9: {message}"):
        read_published(bad)


def test_the_check_predicts_the_priced_rows_from_their_own_acceptance(tmp_path, capsys):
    from reports.commands.published_check import main as published_check

    csv_path = tmp_path / "checked.csv"
    assert published_check(["--drafter", "medusa", "eagle", "--regime", "full", "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    checked = pd.read_csv(csv_path)
    assert len(checked) >= 6 and set(checked["drafter"]) == {"medusa", "eagle"}
    # the prediction is the row's own accepted length over the priced step's overhead
    row = checked.iloc[0]
    assert row["predicted_speedup"] == pytest.approx(row["accept_length"] * row["plain_step_ms"] / row["step_ms"])
    assert row["error"] == pytest.approx(row["predicted_speedup"] / row["speedup"] - 1)
    line = next(line for line in out.splitlines() if "measured" in line and "predicted" in line and "->" in line)
    assert line.index("measured") < line.index("predicted")  # measured evidence first
    assert "mean |error| eagle" in out and "not predicted:" in out and "drafting is not priced yet" not in out


def test_a_priced_row_says_all_of_how_it_is_priced(tmp_path):
    rows = shipped_rows()
    priced = next(i for i, row in enumerate(rows) if row["device"])
    rows[priced]["priced_as"] = ""
    bad = written(rows, tmp_path / "published.csv")
    with pytest.raises(PerfkitError, match=rf"row {priced + 2}: a priced row gives all of device, preset"):
        read_published(bad)


def test_draft_model_ngram_and_eagle3_rows_are_priced_with_their_own_drafting(tmp_path, capsys):
    from reports.commands.published_check import main as published_check

    csv_path = tmp_path / "checked.csv"
    assert published_check(["--drafter", "draft", "ngram", "eagle3", "--regime", "full", "--csv", str(csv_path)]) == 0
    checked = pd.read_csv(csv_path)
    assert set(checked["drafter"]) == {"draft", "ngram", "eagle3"}
    draft = checked[checked["drafter"] == "draft"]
    # the draft model's own steps: vicuna-68m's two layers, named in what the step rests on
    assert (draft["draft_config"] == "vicuna-68m").all() and draft["latency_model"].str.contains("vicuna-68m").all()
    ngram = checked[checked["drafter"] == "ngram"]
    # the host's lookup costs microseconds beside a step of milliseconds
    assert (ngram["draft_ms"] < 0.01 * ngram["plain_step_ms"]).all() and (ngram["draft_ms"] > 0).all()
    assert "mean |error| eagle3" in capsys.readouterr().out


def test_an_eager_harness_row_is_priced_as_the_reference_decoders_eager_step(tmp_path, capsys):
    from reports.commands.published_check import main as published_check

    full, eager = tmp_path / "full.csv", tmp_path / "eager.csv"
    only = ["--drafter", "draft", "--gpu", "rtx-3090"]
    assert published_check([*only, "--regime", "full", "--csv", str(full)]) == 0
    assert published_check([*only, "--csv", str(eager)]) == 0
    assert "eager rows: the reference decoder's eager step, " in capsys.readouterr().out
    full, eager = pd.read_csv(full), pd.read_csv(eager)
    assert len(eager) == 1 and (eager["device"] == "rtx-3090").all()
    assert (full["step"] == "full").all() and (eager["step"] == "traced").all()
    assert (eager["launch"] == "eager").all()
    # the host issues every kernel of the target's steps and of the draft model's: each draft
    # step of a two-layer model costs more eager than its kernels alone
    assert (eager["draft_ms"] / eager["draft_passes"] > full["draft_ms"] / full["draft_passes"]).all()
