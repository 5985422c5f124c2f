"""Issue #22, inputs: measurements of another device, damaged and repeated rows, two sweeps
into one file, unwritable output and sizes past what the arithmetic holds. Each ends in a
one-line error or a warning that counts what was left out, never a silent answer or a
traceback."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from filelock import FileLock

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.hardware.specs import find_spec
from perfmodel.latency.roofline import predict_table
from perfmodel.measured.contract import read_table
from perfmodel.measured.store import measured_rows
from perfmodel.models.config import load_model
from perfmodel.models.grid import PAPER_GRID
from profilers.store import Journal
from profilers.sweep import main as sweep_main
from profilers.sweep_runs import run_sweep
from reports.commands.roofline import main as roofline_main
from tests.helpers import run_here
from tests.test_sweep import config

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "profilers" / "measurements"
H100_PROFILE = SHIPPED / "h100-sxm" / "imported" / "vidur-Llama-2-7b-hf.csv"
CPU = "cpu-amd-epyc-2c"
CPU_SWEEP = SHIPPED / CPU / "llama-7b-fp32.csv"
SMALL = ["--model", "llama-7b", "--batch", "1", "2", "--seq", "128", "--candidates", "1", "16", "--jobs", "1"]


def roofline(tmp_path, capsys, *args) -> tuple[int, str]:
    status = run(roofline_main, [*args, "--out", str(tmp_path / "out"), *SMALL])
    return status, capsys.readouterr().err


def profile_part(tmp_path: Path, rows: int = 400) -> Path:
    """The first rows of the shipped H100 profile, as a file of one's own to damage."""
    lines = H100_PROFILE.read_text().splitlines(keepends=True)[: rows + 1]
    path = tmp_path / "h100.csv"
    path.write_text("".join(lines))
    return path


def set_times(path: Path, times: dict[int, str]) -> None:
    """Replace the time_s field of the given (1-based) lines."""
    lines = path.read_text().splitlines(keepends=True)
    column = lines[0].rstrip("\n").split(",").index("time_s")
    for number, value in times.items():
        fields = lines[number - 1].rstrip("\n").split(",")
        fields[column] = value
        lines[number - 1] = ",".join(fields) + "\n"
    path.write_text("".join(lines))


# ----------------------------------------------------------------------------- item 10: another device's rows


def test_rows_of_another_device_are_refused_naming_both(tmp_path, capsys):
    status, err = roofline(tmp_path, capsys, "--gpu", "a100", "--measurements", str(H100_PROFILE))
    assert status == 1
    assert "measured on h100-sxm, not a100-pcie" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "roofline.csv").exists()


def test_sxm_rows_do_not_stand_for_the_pcie_card(tmp_path, capsys):
    sxm = pd.read_csv(profile_part(tmp_path))
    sxm["device"] = "a100-sxm"
    sxm.to_csv(tmp_path / "sxm.csv", index=False)
    status, err = roofline(tmp_path, capsys, "--gpu", "a100", "--measurements", str(tmp_path / "sxm.csv"))
    assert status == 1 and "measured on a100-sxm, not a100-pcie" in err


def test_a_device_named_by_its_alias_is_the_same_device(tmp_path, capsys):
    rows = pd.read_csv(profile_part(tmp_path))
    rows["device"] = "NVIDIA H100 SXM5 80GB"  # the spec's name, as a GPU reports itself
    rows.to_csv(tmp_path / "named.csv", index=False)
    status, err = roofline(tmp_path, capsys, "--gpu", "h100", "--measurements", str(tmp_path / "named.csv"))
    assert status == 0, err
    assert "measured" not in err


def test_a_stored_cpu_is_not_another_cpu(tmp_path, capsys):
    other = SHIPPED / "cpu-intel-xeon-processor-2c" / "llama-7b-fp32-quick.csv"
    status, err = roofline(tmp_path, capsys, "--gpu", CPU, "--measurements", str(other))
    assert status == 1 and f"measured on cpu-intel-xeon-processor-2c, not {CPU}" in err


def test_nan_rows_and_a_cut_row_are_counted_and_said(tmp_path, capsys):
    path = profile_part(tmp_path)
    set_times(path, {5: "nan", 7: ""})
    with path.open("a") as f:
        f.write("h100-sxm,Llama-2-7b-hf,fp16,up,pre")  # a writer killed mid-line
    status, err = roofline(tmp_path, capsys, "--gpu", "h100", "--measurements", str(path))
    assert status == 0, err
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "2 rows with no time (empty or NaN) (line 5: nan, 7: nan)" in warning
    assert "1 row cut off mid-line (line 402" in warning


# ----------------------------------------------------------------------------- item 17: bad times, damaged lines


@pytest.mark.parametrize("bad", ["0", "-0.001", "inf"])
def test_times_that_are_not_positive_are_left_out_and_counted(tmp_path, capsys, bad):
    path = profile_part(tmp_path)
    set_times(path, {3: bad, 4: bad})
    status, err = roofline(tmp_path, capsys, "--gpu", "h100", "--measurements", str(path))
    assert status == 0, err
    assert "2 rows with a time <= 0 or infinite (line 3:" in err and "Traceback" not in err


def test_a_text_time_is_left_out_and_counted(tmp_path, capsys):
    path = profile_part(tmp_path)
    set_times(path, {6: "fast"})
    status, err = roofline(tmp_path, capsys, "--gpu", "h100", "--measurements", str(path))
    assert status == 0, err
    assert "1 row with a time that is not a number (line 6: 'fast')" in err


def test_a_time_column_without_numbers_is_an_error(tmp_path, capsys):
    rows = pd.read_csv(profile_part(tmp_path, rows=20))
    rows["time_s"] = "slow"
    rows.to_csv(tmp_path / "words.csv", index=False)
    status, err = roofline(tmp_path, capsys, "--gpu", "h100", "--measurements", str(tmp_path / "words.csv"))
    assert status == 1 and "column time_s holds no numbers (line 2: 'slow')" in err
    assert len(err.strip().splitlines()) == 1


def test_a_garbage_line_keeps_the_good_rows(tmp_path):
    path = profile_part(tmp_path, rows=50)
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(10, "x" + "," * 40 + "\n")  # more fields than the header: pandas' ParserError before
    path.write_text("".join(lines))
    said = []
    rows = measured_rows(path, "h100-sxm", log=said.append)
    assert len(rows) == 50
    assert said == [f"{path}: left out 1 line that is not a row (line 11: another field count than the header)"]


def test_a_garbage_line_in_a_sweep_is_skipped_on_resume(tmp_path, capsys):
    first = run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None)
    lines = first.out.read_text().splitlines(keepends=True)
    assert len(lines) == 9
    lines[4] = "x" + "," * 40 + "\r\n"  # line 5 overwritten by garbage
    first.out.write_text("".join(lines))
    again = run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None)
    assert again.measured == 1  # only the point whose line was lost; the 7 good rows are kept
    assert "left out 1 line that is not a row (line 5" in capsys.readouterr().err
    assert len(Journal(first.out, log=lambda *_: None).rows()) == 8


# ----------------------------------------------------------------------------- item 12: two sweeps, one file


def test_a_second_sweep_into_a_locked_file_is_refused_at_once(tmp_path):
    out = tmp_path / "sweep.csv"
    with FileLock(str(out) + ".lock", timeout=0):  # the first sweep, still running
        with pytest.raises(PerfkitError, match=r"another sweep is writing .*sweep\.csv .*sweep\.csv\.lock"):
            run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None)
    assert not out.exists() or len(pd.read_csv(out)) == 0
    assert run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None).measured == 8  # free again


def test_the_second_sweep_command_ends_in_one_line(tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    with FileLock(str(out) + ".lock", timeout=0):
        result = run_here(sweep_main, ["--device", "cpu", "--out", str(out), "--no-ceilings"], capsys)
    assert result.status == 1 and result.err.startswith("error: another sweep is writing")
    assert len(result.err.strip().splitlines()) == 1


def test_repeated_points_are_collapsed_and_said(tmp_path):
    once = pd.read_csv(CPU_SWEEP)
    twice = pd.concat([once, once.assign(time_s=once["time_s"] * 2)], ignore_index=True)  # two sweeps, one file
    twice.to_csv(tmp_path / "twice.csv", index=False)
    said = []
    rows = measured_rows(tmp_path / "twice.csv", CPU, log=said.append)
    assert len(rows) == len(once)
    assert rows["time_s"].tolist() == pytest.approx((once["time_s"] * 2).tolist())  # the last of each point
    assert len(said) == 1 and f"{len(once)} rows repeat an earlier row's point" in said[0]


def test_a_sweep_counts_each_point_once(tmp_path):
    first = run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None)
    text = first.out.read_text()
    first.out.write_text(text + "".join(text.splitlines(keepends=True)[1:]))  # every row twice
    again = run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None)
    assert again.measured == 0 and again.total_rows == 8


# ----------------------------------------------------------------------------- item 15: unwritable output


def refused_as_read(main, argv, capsys) -> str:
    """The one-line refusal of a command line whose output path cannot be written (checked
    when the command line is read, before any work)."""
    with pytest.raises(SystemExit) as exit_:
        run(main, argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_roofline_out_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("in the way")
    err = refused_as_read(roofline_main, ["--gpu", "a100", "--out", str(tmp_path / "file" / "out"), *SMALL], capsys)
    assert "output folder" in err and "a file, not a folder" in err


def test_sweep_out_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("in the way")
    out = tmp_path / "file" / "sweep.csv"
    err = refused_as_read(sweep_main, ["--device", "cpu", "--out", str(out), "--no-ceilings", "--no-progress"], capsys)
    assert "output file" in err and "a file, not a folder" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_one_line(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        status = run(sweep_main, ["--device", "cpu", "--out", str(folder / "s.csv"), "--no-ceilings"])
        assert status == 1 and "cannot write" in capsys.readouterr().err
        status = run(roofline_main, ["--gpu", "a100", "--out", str(folder), *SMALL])
        assert status == 1 and "cannot write the output folder" in capsys.readouterr().err
    finally:
        folder.chmod(0o755)


# ----------------------------------------------------------------------------- item 16: extreme sizes


def test_a_sequence_past_int64_arithmetic_is_refused_naming_what_fits(tmp_path, capsys):
    status = run(roofline_main, ["--gpu", "a100", "--seq", "10000000", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 1 and len(err.splitlines()) == 1
    assert "seq_len 10,000,000" in err and "seq_len up to 4,194,303 at batch 64" in err


def test_the_largest_sequence_said_to_fit_does_fit():
    model, spec = load_model("llama-7b"), find_spec("a100")
    fits = predict_table(spec, model, "fp16", PAPER_GRID.narrowed(None, [4_194_303]))
    assert (fits["flops"] > 0).all() and np.isfinite(fits["time_s"]).all() and (fits["time_s"] > 0).all()
    with pytest.raises(PerfkitError, match="64-bit integers"):
        predict_table(spec, model, "fp16", PAPER_GRID.narrowed(None, [4_194_304]))


@pytest.mark.parametrize("command", ["perfmodel.roofline", "profilers.sweep"])
def test_a_batch_past_the_bound_is_a_usage_error(command, capsys):
    main, device = (
        (roofline_main, ["--gpu", "a100"]) if command == "perfmodel.roofline" else (sweep_main, ["--device", "cpu"])
    )
    result = run_here(main, [*device, "--batch", "99999999999999999999999"], capsys)
    assert result.status == 2 and "Traceback" not in result.err
    assert "--batch: must be at most 1,048,576 (2^20 sequences), got '99999999999999999999999'" in result.err


def test_a_sequence_past_the_bound_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        roofline_main(["--gpu", "a100", "--seq", str(2**24 + 1)])
    assert exit_.value.code == 2 and "must be at most 16,777,216 (2^24 tokens)" in capsys.readouterr().err


def test_shipped_tables_read_without_a_word(capsys):
    for path in sorted(SHIPPED.glob("*/*.csv")) + sorted(SHIPPED.glob("*/imported/vidur-*.csv")):
        device = path.parent.name if path.parent.name != "imported" else path.parent.parent.name
        assert len(measured_rows(path, device)) > 0
        assert len(read_table(path)) > 0
    assert capsys.readouterr().err == ""


def test_a_user_seq_past_the_models_context_is_noted(tmp_path, capsys):
    # llama-7b (LLaMA-1) was trained on 2048 tokens: a 4096-token point is priced but said to be unreachable
    args = ["--gpu", "a100", "--model", "llama-7b", "--seq", "4096", "--batch", "1", "--candidates", "1"]
    assert run(roofline_main, [*args, "--out", str(tmp_path / "r"), "--jobs", "1"]) == 0
    assert "--seq 4096 is past llama-7b's 2048-token context" in capsys.readouterr().err
