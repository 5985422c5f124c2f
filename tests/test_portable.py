"""The README's commands on a machine whose CPU is not the one the toolkit ships data of:
`--gpu cpu` still gives a report, says whose measurements it shows, and errors list what is
stored and the command to run. The CPU identity is faked through MEDUSA_PERFKIT_CPU."""

from __future__ import annotations

import os
from html import unescape
from pathlib import Path

import pytest

from perfmodel.cli import run
from perfmodel.hardware.cpu_identity import CPU_NAME_VARIABLE, this_cpu_key
from perfmodel.measured import store as measurements
from perfmodel.measured.device_view import resolve_view, stand_in_key
from perfmodel.measured.store import HOME_VARIABLE, stored_devices
from perfmodel.models.config import load_model
from profilers.device import cpu_info
from reports.__main__ import main as reports_main
from tests.helpers import time_quickly

SHIPPED_CPU = "cpu-intel-xeon-processor-2c"


@pytest.fixture
def other_cpu(monkeypatch) -> str:
    """This test runs as if on a 2-core AMD EPYC 9654, of which nothing is stored."""
    monkeypatch.setenv(CPU_NAME_VARIABLE, "AMD EPYC 9654 96-Core Processor")
    key = this_cpu_key()
    assert key not in stored_devices() and key == cpu_info().key
    return key


def test_the_cpu_identity_can_be_named(monkeypatch):
    monkeypatch.setenv(CPU_NAME_VARIABLE, "Intel(R) Xeon(R) Processor")
    assert this_cpu_key().startswith("cpu-intel-xeon-processor-")
    assert cpu_info().name == "Intel(R) Xeon(R) Processor"


def test_readme_cpu_report_works_on_another_cpu_from_any_folder(other_cpu, tmp_path, monkeypatch, capsys):
    shown = stand_in_key(other_cpu, stored_devices())
    assert (
        shown is not None and shown.startswith("cpu-") and shown.endswith("-2c")
    )  # the shipped sweeps are of 2-core CPUs
    monkeypatch.chdir(tmp_path)  # the README's relative model path, not from the repository root
    assert reports_main(["build", "--gpu", "cpu", "--model", "decoder/assets/bundled", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert f"this machine's CPU ({other_cpu}) has no stored measurements: showing {shown}'s" in out
    folder = tmp_path / "perf-reports" / "report" / f"{shown}-bundled"  # named for the device shown
    html = unescape((folder / "report.html").read_text(encoding="utf-8"))
    assert (
        f"Stand-in: this machine's CPU ({other_cpu})" in html
        and "python -m perfmodel.roofline --gpu cpu --measure" in html
    )
    assert 'class="tag measured"' in html  # the stand-in's ceilings, acceptance record and closed loop are still shown
    assert len(list(folder.glob("*.png"))) >= 10


def test_this_machines_own_sweep_wins_over_a_stand_in(monkeypatch):
    # This machine plays the 2-core Xeon the shipped sweep is of, whatever its own core count.
    monkeypatch.setenv(CPU_NAME_VARIABLE, "Intel(R) Xeon(R) Processor")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert this_cpu_key() == SHIPPED_CPU
    view = resolve_view("cpu", None, [], log=lambda line: pytest.fail(f"no note expected, got {line!r}"))
    assert view.spec.key == SHIPPED_CPU and view.stand_in_for is None


def test_a_named_stored_cpu_needs_no_identity(other_cpu):
    view = resolve_view(SHIPPED_CPU, None, [], log=print)
    assert view.spec.key == SHIPPED_CPU and view.stand_in_for is None and view.is_cpu


def test_stand_in_prefers_the_same_core_count_then_vendor():
    stored = ["cpu-amd-epyc-7763-8c", "cpu-intel-xeon-gold-6338-2c", "cpu-amd-epyc-7b13-2c", "h100-sxm"]
    assert stand_in_key("cpu-amd-epyc-9654-2c", stored) == "cpu-amd-epyc-7b13-2c"
    assert stand_in_key("cpu-intel-core-i7-2c", stored) == "cpu-intel-xeon-gold-6338-2c"
    assert stand_in_key("cpu-arm-neoverse-64c", stored) in stored[:3]
    assert stand_in_key("cpu-x-2c", ["h100-sxm"]) is None


def test_nothing_stored_is_an_error_naming_what_to_run(other_cpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(measurements, "MEASUREMENTS_DIR", tmp_path / "shipped")
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path / "home"))
    assert run(reports_main, ["build", "--gpu", "cpu", "--model", "bundled", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert f"no measurements of {other_cpu} are stored" in err and "no CPU measurements are stored" in err
    assert "python -m perfmodel.roofline --gpu cpu --measure" in err and "--measure on python -m reports build" in err


def test_a_named_cpu_that_is_not_stored_lists_the_stored_ones(capsys):
    assert run(reports_main, ["build", "--gpu", "cpu-nonesuch-4c", "--model", "bundled", "--out", "unused"]) == 1
    err = capsys.readouterr().err
    assert "no measurements of cpu-nonesuch-4c are stored" in err
    listed = err.split("stored CPUs: ")[1].split(" (")[0].split(", ")
    assert SHIPPED_CPU in listed and listed == sorted(d for d in stored_devices() if d.startswith("cpu-"))


def test_model_paths_resolve_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_model("decoder/assets/bundled") == load_model("bundled")
    assert load_model("decoder/assets/bundled").name == "bundled"
    with pytest.raises(Exception, match="unknown model 'decoder/assets/nothing'"):
        load_model("decoder/assets/nothing")
    assert Path.cwd() == tmp_path


def test_report_measure_sweeps_this_cpu_and_stores_it(other_cpu, tmp_path, monkeypatch, capsys):
    """`reports build --gpu cpu --measure`: a real sweep of this CPU (tiny model, short timer
    budget), stored, so the next command uses this machine's own data without --measure."""
    import json

    folder = tmp_path / "tiny"
    folder.mkdir()
    config = dict(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=64,
    )
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path / "home"))
    time_quickly(monkeypatch)
    args = ["build", "--gpu", "cpu", "--model", str(folder), "--acceptance", "paper", "--jobs", "1"]
    assert reports_main([*args, "--measure", "--out", str(tmp_path / "first")]) == 0
    assert "no stored measurements" not in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "home" / "measurements" / other_cpu).glob("*.csv")] == ["tiny-fp32.csv"]

    assert reports_main([*args, "--out", str(tmp_path / "again")]) == 0
    assert "no stored measurements" not in capsys.readouterr().out
    html = unescape((tmp_path / "again" / "report.html").read_text(encoding="utf-8"))
    assert f"({other_cpu})" in html and "Stand-in" not in html
    assert "Operators: predicted time (" in html and ") vs measured time, error = " in html  # its own model's rows
    assert (
        "kernel overhead measured with the ceilings" in html or "per-kernel overhead measured with the ceilings" in html
    )
