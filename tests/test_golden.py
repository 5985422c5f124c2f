"""The golden check (python -m reports.golden): what a refactor must leave byte for byte."""

from __future__ import annotations

import pytest

from perfmodel.base.errors import PerfkitError
from reports import golden
from reports.readme_samples import ROOT

POINT = "python -m perfmodel.speedup --gpu a100 --model llama-7b --tree-size 64 --acceleration 3.0"


def write(folder, name, text):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_differences_are_named_and_run_noise_is_not(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    for folder, wall in ((before, "1.2"), (after, "3.4")):
        write(folder, "stdout.txt", f"wrote {folder}/table.csv\nbuilt in {wall} s\n")
        write(folder, "out/same.png", "\x89PNG same")
    write(before, "out/table.csv", "batch,ms\n1,2.50\n")
    write(after, "out/table.csv", "batch,ms\n1,2.51\n")
    write(before, "out/gone.json", "{}")
    found = {d.file: d.what for d in golden.compare_runs("cmd", before, after)}
    assert found == {
        "out/table.csv": "line 2: '1,2.50' became '1,2.51'",
        "out/gone.json": "written before, not after",
    }


def test_a_checkout_against_itself_is_identical(tmp_path, capsys):
    assert golden.main(["--tree", str(ROOT), "--command", POINT, "--keep", str(tmp_path / "runs")]) == 0
    assert "everything identical over 1 command(s)" in capsys.readouterr().out
    assert (tmp_path / "runs" / "after" / f"00-{golden.slug(POINT)}" / "stdout.txt").read_text().strip()


def test_the_golden_set_holds_the_documented_samples():
    commands = golden.golden_commands()
    assert "python -m perfmodel.roofline --gpu a100" in commands
    assert set(golden.GOLDEN_COMMANDS) <= set(commands)
    assert len(commands) == len(set(commands))


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--command", POINT], "say what to compare with"),
        (["--against", "no-such-ref-xyz", "--command", POINT], "--against no-such-ref-xyz: git cannot export it"),
        (["--tree", "/", "--command", POINT], "--tree /: not a medusa-perfkit checkout"),
        (["--tree", ".", "--jobs", "0", "--command", POINT], "--jobs must be at least 1, got 0"),
    ],
)
def test_bad_usage_is_one_line(argv, said):
    with pytest.raises(PerfkitError, match=said.replace("/", "/")):
        golden.main(argv)


def test_a_kept_folder_that_holds_files_is_refused(tmp_path):
    (tmp_path / "old.txt").write_text("a run of before")
    with pytest.raises(PerfkitError, match="the folder is not empty"):
        golden.main(["--tree", str(ROOT), "--command", POINT, "--keep", str(tmp_path)])
