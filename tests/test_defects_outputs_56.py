"""Issue 56, outputs: two runs into one folder at once never both report what only one of them
left there, figures are written whole or not at all, a figure cache is checked as it is read
back, inputs are read before any output is written, and --jobs is bounded by the cores. Each
test fails on the main before the fix."""

from __future__ import annotations

import errno
import importlib
import multiprocessing
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest

from perfmodel import allreduce_compare
from perfmodel.base import output_locks
from perfmodel.base.errors import PerfkitError
from perfmodel.base.output_locks import FOLDER_LOCK
from perfmodel.cli import run
from perfmodel.schedule import main as schedule_main
from reports import golden
from reports.__main__ import main as reports_main
from reports.commands.roofline import main as roofline_main
from reports.commands.speedup import main as speedup_main
from reports.figure_cache import FOLDER_VARIABLE
from tests.helpers import run_here

WAIT_S = 120  # far past what the first run takes to reach its pause: only a hang waits this long
ONE_CORE = ["--jobs", "1"]


def assert_one_line(err: str, *fragments: str) -> None:
    err = err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def outputs(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` but its lock (an empty file, no output)."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != FOLDER_LOCK
    }


# --------------------------------------------------------------------------- item 9


@contextmanager
def first_run(main, argv: list[str], pause_at: str, monkeypatch):
    """`main(argv)` in a forked process, stopped in `pause_at` (a function the command calls once
    its work has begun) until the block ends; yields the process (its exit code is the command's
    status). A fork shares what this process imported: the first run is in its work at once."""
    fork = multiprocessing.get_context("fork")
    reached, go_on = fork.Event(), fork.Event()
    module, name = pause_at.rsplit(".", 1)
    real = getattr(importlib.import_module(module), name)

    def paused(*args, **kwargs):
        reached.set()
        go_on.wait(WAIT_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(pause_at, paused)
    child = fork.Process(target=lambda: sys.exit(run(main, argv)))
    child.start()
    try:
        assert reached.wait(WAIT_S), "the first run never reached its work"
        monkeypatch.setattr(pause_at, real)  # the second run, in this process, goes straight through
        yield child
    finally:
        go_on.set()
        child.join(WAIT_S)


# command: its main, its arguments but the model and --out, where its first run pauses, a file it writes
AT_ONCE = {
    "roofline": (
        roofline_main,
        ["--gpu", "a100", "--batch", "1", "--seq", "128"],
        "reports.commands.roofline.write_page",
        "roofline.csv",
    ),
    "reports-build": (reports_main, ["build", "--gpu", "a100"], "reports.build.inputs_section", "report.html"),
    "reports-compare": (
        reports_main,
        ["compare", "--gpu", "a100"],
        "reports.compare.compare_answer_section",
        "compare.html",
    ),
    "speedup": (speedup_main, ["--gpu", "a100"], "reports.commands.speedup.device_table", "speedup.csv"),
    "schedule": (
        schedule_main,
        ["--gpu", "a100", "--batch", "1", "2", "--context", "512", "--sizes", "1", "4"],
        "perfmodel.schedule.schedule_deployment",
        "schedule.json",
    ),
}


@pytest.mark.parametrize("command", list(AT_ONCE))
def test_a_second_run_into_a_folder_in_use_is_refused_and_the_first_ones_output_stays(
    command, tmp_path, monkeypatch, capsys
):
    main, args, pause_at, kept = AT_ONCE[command]
    out = tmp_path / "out"
    jobs = ONE_CORE if command != "schedule" else []
    first = [*args, "--model", "llama-7b", *jobs, "--out", str(out)]
    second = [*args, "--model", "llama-13b", *jobs, "--out", str(out)]
    with first_run(main, first, pause_at, monkeypatch) as running:
        ran = run_here(main, second, capsys)
        assert ran.status == 1, f"the second run said it wrote {out} while the first was writing it"
        assert_one_line(ran.err, "another command is writing", str(out))
    assert running.exitcode == 0
    page = (out / kept).read_text(encoding="utf-8")
    assert "llama-7b" in page and "llama-13b" not in page  # the first run's, whole


def test_two_runs_into_the_same_default_folder_at_once_are_one_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # perf-reports/speedup/<device>-<model>-<dtype>, the folder both would write
    argv = ["--gpu", "a100", "--model", "llama-7b", *ONE_CORE]
    with first_run(speedup_main, argv, "reports.commands.speedup.device_table", monkeypatch) as running:
        ran = run_here(speedup_main, argv, capsys)
        assert ran.status == 1
        assert_one_line(ran.err, "another command is writing", "perf-reports/speedup/a100")
    assert running.exitcode == 0
    (written,) = (tmp_path / "perf-reports" / "speedup").iterdir()
    assert (written / "speedup.csv").is_file()


def test_a_run_after_the_first_has_finished_goes_on_and_the_lock_adds_no_file(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--gpu", "a100", "--batch", "1", "2", "--context", "512", "--sizes", "1", "4", "--out", str(out)]
    assert run_here(schedule_main, [*args, "--model", "llama-7b"], capsys).status == 0
    assert run_here(schedule_main, [*args, "--model", "llama-13b"], capsys).status == 0
    assert "llama-13b" in (out / "schedule.json").read_text()
    assert {p.name for p in out.iterdir()} == {"schedule.json", "vllm", "sglang", "tensorrt-llm"}


def test_where_a_folder_cannot_be_locked_a_file_in_it_is(tmp_path, monkeypatch):
    real = output_locks.fcntl.flock

    def nfs(descriptor, operation):  # flock on NFS needs a file open for writing, not a folder
        if stat.S_ISDIR(os.fstat(descriptor).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(descriptor, operation)

    monkeypatch.setattr(output_locks.fcntl, "flock", nfs)
    out = tmp_path / "out"
    with output_locks.claimed_dir(out):
        with pytest.raises(PerfkitError, match=f"another command is writing {out} .*{FOLDER_LOCK}"):
            with output_locks.claimed_dir(out):
                pass
    assert (out / FOLDER_LOCK).is_file()


# --------------------------------------------------------------------------- item 10


def test_a_full_disk_leaves_no_figure_cut_short(tmp_path, monkeypatch, capsys):
    out = tmp_path / "speedup"
    real = Path.write_bytes

    def disk_fills(path, data):
        if path.suffix != ".png":
            return real(path, data)
        real(path, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(Path, "write_bytes", disk_fills)
    ran = run_here(speedup_main, ["--gpu", "a100", "--model", "llama-7b", *ONE_CORE, "--out", str(out)], capsys)
    assert ran.status == 1
    assert_one_line(ran.err, "No space left on device")
    assert outputs(out) == {}, sorted(outputs(out))  # no PNG of half its bytes, nothing after it


# --------------------------------------------------------------------------- item 11


def test_a_figure_cache_cut_short_is_drawn_again_not_embedded_broken(tmp_path, monkeypatch):
    cache = tmp_path / "figures"
    monkeypatch.setenv(FOLDER_VARIABLE, str(cache))
    argv = ["compare", "--gpu", "a100", "--model", "llama-7b", *ONE_CORE, "--out"]
    assert run(reports_main, [*argv, str(tmp_path / "first")]) == 0
    kept = [p for p in cache.iterdir() if p.suffix in (".png", ".svg") and p.stat().st_size > 100]
    assert kept
    for path in kept:  # a disk that filled while the cache was written
        path.write_bytes(path.read_bytes()[:100])
    assert run(reports_main, [*argv, str(tmp_path / "again")]) == 0
    assert outputs(tmp_path / "again") == outputs(tmp_path / "first")  # the page and its PNGs, whole
    for png in cache.glob("*.png"):  # and the cache whole again
        assert matplotlib.image.imread(png).shape[0] > 100, png.name


# --------------------------------------------------------------------------- item 12


def test_a_missing_input_costs_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "exports"
    missing = tmp_path / "no-such-run.csv"
    argv = ["--gpu", "a100", "--model", "llama-7b", "--out", str(out), "--closed-loop", str(missing)]
    ran = run_here(schedule_main, argv, capsys)
    assert ran.status == 1
    assert_one_line(ran.err, str(missing))
    assert not out.exists(), sorted(outputs(out))


def test_an_import_that_cannot_read_every_table_replaces_none(tmp_path, monkeypatch, capsys):
    def vidur_table(path, topology):
        if not Path(path).exists():
            raise PerfkitError(f"{path}: no such file")
        return pd.DataFrame({"num_workers": [2], "bytes": [1024], "time_s": [1e-5]})

    monkeypatch.setattr(allreduce_compare, "import_vidur_all_reduce", vidur_table)
    tables = tmp_path / "tables"
    monkeypatch.setattr(allreduce_compare, "table_path", lambda device, topology: tables / device / topology)
    source = tmp_path / "vidur"
    (source / "a100_dgx").mkdir(parents=True)
    (source / "a100_dgx" / "all_reduce.csv").write_text("the first table of four\n")
    ran = run_here(allreduce_compare.main, ["--import-vidur", str(source)], capsys)
    assert ran.status == 1
    assert_one_line(ran.err, "a100_pairwise_nvlink")
    assert not tables.exists()  # not the first table, before the second was found missing


# --------------------------------------------------------------------------- item 13


def test_jobs_past_the_cores_are_refused_before_any_process_starts(tmp_path, monkeypatch, capsys):
    def no_work(*args, **kwargs):
        raise AssertionError("work started before --jobs was checked")

    monkeypatch.setattr("reports.build.load_inputs", no_work)
    monkeypatch.setattr(golden, "check", no_work)
    cores = os.cpu_count() or 1
    out = str(tmp_path / "report")
    ran = run_here(reports_main, ["build", "--gpu", "a100", "--jobs", "10000", "--out", out], capsys)
    assert ran.status == 2
    assert_one_line(ran.err, "--jobs", f"at most {cores:,}", "'10000'")
    for main, argv in ((roofline_main, ["--gpu", "a100"]), (speedup_main, ["--gpu", "a100"])):
        assert run_here(main, [*argv, "--jobs", str(cores + 1), "--out", out], capsys).status == 2
    with pytest.raises(PerfkitError, match=f"--jobs must be at most {cores} .*, got 10000"):
        golden.main(["--tree", ".", "--jobs", "10000", "--command", "python -m perfmodel.speedup --gpu a100"])
    with pytest.raises(AssertionError, match="work started"):  # as many as the cores: on to the work
        run(reports_main, ["build", "--gpu", "a100", "--jobs", str(cores), "--out", out])
