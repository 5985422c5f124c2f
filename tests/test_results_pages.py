"""Results pages quote what shipped runs measured: their tables are what the commands print
from the shipped files, and the numbers in their prose are the records'."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from profilers.closed_loop.results import main as results_main
from profilers.closed_loop.results import tables

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
EAGLE_RUNS = ROOT / "profilers" / "measurements" / "cpu-amd-epyc-2c" / "closed-loop-eagle"
TWIN_RUNS = ROOT / "profilers" / "measurements" / "cpu-intel-xeon-processor-2c" / "twin"


@pytest.mark.parametrize(
    "page, runs",
    [
        ("closed-loop-eagle-amd-epyc-2c.md", [EAGLE_RUNS / f"validate-bundled-eagle-run{i}.csv" for i in (2, 3)]),
        ("closed-loop-eagle-amd-epyc-2c.md", [EAGLE_RUNS / "superseded" / "validate-bundled-eagle-run1.csv"]),
        ("twin-closed-loop.md", [TWIN_RUNS / f"tinyllama-1.1b-bf16-run{i}.csv" for i in (3, 4)]),
        ("twin-closed-loop.md", [TWIN_RUNS / f"tinyllama-1.1b-bf16-run{i}.csv" for i in (1, 2)]),
    ],
)
def test_a_results_page_shows_the_tables_its_runs_print(page, runs):
    printed = tables(runs).split("\n\n", 1)[1].strip()  # the table and its verdict; pages word the run names
    assert printed in (RESULTS / page).read_text()


def test_the_eagle_runs_the_page_calls_within_target_are():
    text = tables([EAGLE_RUNS / f"validate-bundled-eagle-run{i}.csv" for i in (2, 3)])
    assert "every point within the 10% target" in text and "NOT" not in text


def test_a_file_that_is_no_closed_loop_run_is_refused_in_one_line(tmp_path, capsys):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert run(results_main, [str(other)]) == 1
    err = capsys.readouterr().err
    assert "not a closed loop's --csv (no batch, tree_size" in err and err.count("\n") == 1
    with pytest.raises(PerfkitError, match="no such file"):
        tables([tmp_path / "missing.csv"])


def test_the_decoder_guide_gives_the_records_tokens_per_step_beside_each_other():
    """docs/decoder.md's table of the heads against EAGLE at equal tree sizes is the records'."""
    data = RESULTS / "data"
    records = {d: json.loads((data / f"acceptance-{d}-greedy.json").read_text()) for d in ("medusa", "eagle")}
    guide = (ROOT / "docs" / "decoder.md").read_text()
    for drafter, record in records.items():
        assert record["drafter"] == drafter and record["lossless"] is True
    by_size = {
        d: {row["tree_size"]: row["mean_accepted_tokens"] for row in r["per_tree_size"]} for d, r in records.items()
    }
    for size in (4, 16, 64):
        row = f"| {size} | {by_size['medusa'][size]:.2f} | {by_size['eagle'][size]:.2f} |"
        assert row in guide, row
    default = f"| 49 (default tree) | {records['medusa']['mean_accepted_tokens']:.2f} | "
    assert default + f"{records['eagle']['mean_accepted_tokens']:.2f} |" in guide
    for drafter in ("medusa", "eagle"):
        dynamic = json.loads((data / f"acceptance-{drafter}-dynamic48-greedy.json").read_text())
        assert dynamic["lossless"] is True
        assert re.search(rf"\b{dynamic['mean_accepted_tokens']:.2f}\b", guide)
