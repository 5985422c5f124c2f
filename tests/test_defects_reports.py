"""Issue 22, reports: measured evidence before prediction, labels that name the real
source, signed errors, units, source notes, the spec path, samples made by their
commands, package data, the user's matplotlib backend, and report folders that hold one
build and fail in one line."""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hw_specs import SPEC_DIR
from perfmodel.cli import run
from perfmodel.latency.source import view_latency
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import load_model
from reports.__main__ import main
from tests.helpers import number, parse_page

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "profilers" / "measurements"
AMD = "cpu-amd-epyc-2c"  # its shipped closed loop measured every tree below plain decoding
AMD_LOOP = MEASUREMENTS / AMD / "closed-loop" / "validate-bundled.csv"


def build(*args: str) -> int:
    return run(main, ["build", *args, "--jobs", "1"])


@pytest.fixture(scope="module")
def amd_build(tmp_path_factory) -> tuple[Path, str]:
    """The report folder and what the command printed."""
    out = tmp_path_factory.mktemp("amd")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert build("--gpu", AMD, "--model", "bundled", "--out", str(out)) == 0
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def amd_report(amd_build) -> Path:
    return amd_build[0]


@pytest.fixture(scope="module")
def a100_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("a100")
    assert build("--gpu", "a100", "--model", "llama-7b", "--out", str(out)) == 0
    return out


def page_of(folder: Path, name: str = "report.html"):
    return parse_page((folder / name).read_text(encoding="utf-8"))


# ----------------------------------------------------------------- item 3: measured first


def test_the_headline_states_the_measured_speedups_first_and_why_predictions_differ(amd_report, capsys):
    loop = pd.read_csv(AMD_LOOP)
    assert loop["measured_speedup"].max() < 1  # the shipped evidence: no tree paid
    glance = page_of(amd_report).section("At a glance").bullets
    first, why = glance[0], glance[1]
    assert first.startswith("Measured") and "no tree paid" in first
    lo, hi = loop["measured_speedup"].min(), loop["measured_speedup"].max()
    assert f"{lo:.2f}-{hi:.2f}x" in first and "batch 1" in first and "context 112" in first
    # why the predictions differ: their context against the measured one, and the signed error
    assert "context 1024" in why and "112" in why and "(predicted - measured) / measured" in why
    assert f"{loop['error'].min():+.1%} to {loop['error'].max():+.1%}" in why
    # no predicted verdict that the measurement contradicts goes unmarked
    for fact in glance[2:]:
        if "(predicted)" in fact:
            assert "still pays" not in fact and "->" not in fact, fact
    assert any("the measurement above disagrees: no tree paid at batch 1" in fact for fact in glance)
    # the measured figure leads the speedup section
    speedup = page_of(amd_report).section("Speedup")
    assert speedup.figures[0].badges == ["measured", "predicted"]


def test_the_command_prints_the_measured_fact_first(amd_build):
    facts = amd_build[1].split("html: ", 1)[1].splitlines()[1:]
    assert facts[0].strip().startswith("Measured (closed loop")


# ----------------------------------------------------------------- item 5


def test_compare_names_each_devices_latency_source(tmp_path):
    assert run(main, ["compare", "--gpu", "a100", "a40", "h100", "--out", str(tmp_path), "--jobs", "1"]) == 0
    html = (tmp_path / "compare.html").read_text(encoding="utf-8")
    assert "roofline model" not in html
    page = parse_page(html)
    devices = page.section("Ceilings").table("device", "latency")
    model = load_model("llama-7b")
    for key, label in zip(devices.column("device"), devices.column("latency")):
        assert label == view_latency(resolve_view(key, None, []), model, "fp16").label
    modes = {key: view_latency(resolve_view(key, None, []), model, "fp16").mode for key in devices.column("device")}
    assert len(set(modes.values())) > 1  # the case the old label got wrong: sources that differ
    assert "h100-sxm: measured operator times" in html and "a40: GEMMs transferred from the measured devices" in html


def test_the_sample_check_fails_on_a_stale_block(tmp_path, capsys):
    from reports import readme_samples  # new in issue 22: imported here so the other tests run on older code

    readme = tmp_path / "README.md"
    readme.write_text(
        textwrap.dedent(
            """\
            <!-- sample: python -m perfmodel.speedup --help -->
            ```
            usage: an old copy
            ```
            """
        )
    )
    assert run(readme_samples.main, ["--readme", str(readme), "--check"]) == 1
    assert "out of date: python -m perfmodel.speedup --help" in capsys.readouterr().out
    assert "an old copy" in readme.read_text()
    assert run(readme_samples.main, ["--readme", str(readme)]) == 0
    assert "usage: python -m perfmodel.speedup" in readme.read_text() and "an old copy" not in readme.read_text()
    readme.write_text("no markers\n")
    assert run(readme_samples.main, ["--readme", str(readme), "--check"]) == 1
    assert "no sample markers" in capsys.readouterr().err


def test_the_cpu_report_gives_small_rates_in_a_readable_unit(amd_report):
    page = page_of(amd_report)
    device = page.section("Device").table("field", "value", "unit")
    peaks = {r["field"]: r for r in device.records() if r["field"].startswith("peak_tflops.")}
    stored = resolve_view(AMD, None, []).spec.peak_tflops
    fp16 = peaks["peak_tflops.fp16"]  # 0.000996694 TFLOP/s stored
    assert fp16["unit"] == "MFLOP/s" and number(fp16["value"]) == pytest.approx(stored["fp16"] * 1e6, rel=5e-3)
    for row in [*peaks.values(), *page.section("Ceilings").table("measurement", "value", "unit").records()]:
        if row["unit"].startswith("T"):
            assert number(row["value"]) >= 1, row
    ceilings = page.section("Ceilings").tables[0]
    assert "peak fp32 GFLOP/s" in ceilings.columns and ceilings.numbers("peak fp32 GFLOP/s")[0] > 1


WORKING_NOTES = re.compile(r"this session|re-read|(design )?brief's \d|the brief|todo|tbd", re.IGNORECASE)


@pytest.mark.parametrize("path", sorted(SPEC_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_spec_notes_are_statements_about_sources(path):
    data = yaml.safe_load(path.read_text())
    texts = [str(data.get("notes", "")), *map(str, (data.get("sources") or {}).values())]
    for text in texts:
        assert not WORKING_NOTES.search(text), WORKING_NOTES.search(text).group(0) + " in " + text


def device_input(folder: Path) -> str:
    return next(b for b in page_of(folder).section("Inputs").bullets if b.startswith("Device:"))


def test_the_report_names_the_spec_file_it_read(a100_report):
    # a spec file of one's own is named by its path as given (tests/test_reports.py's escaping test)
    assert "spec hw_specs/a100-pcie.yaml" in device_input(a100_report)


# ----------------------------------------------------------------- packaging


def package_data() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]


@pytest.mark.parametrize("folder", ["profilers/measurements", "decoder/assets", "hw_specs", "perfmodel/measured"])
def test_package_data_ships_every_data_file(folder):
    """setuptools matches package data with glob(package / pattern, recursive=True): every
    data file under the folder must be matched, or a wheel install lacks it."""
    package = folder.split("/")[0]
    patterns = package_data().get(package, [])
    shipped = {
        Path(p).resolve() for pattern in patterns for p in glob.glob(str(ROOT / package / pattern), recursive=True)
    }
    files = [
        p
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert files
    missing = [str(p.relative_to(ROOT)) for p in files if p.resolve() not in shipped]
    assert not missing, f"not in package data {patterns}: {missing}"


def test_importing_and_drawing_reports_leaves_the_users_backend(tmp_path):
    script = textwrap.dedent(
        f"""
        import matplotlib
        matplotlib.use("pdf")
        import reports, reports.build, reports.compare, reports.plotting, reports.render
        from reports.__main__ import main
        assert matplotlib.get_backend() == "pdf", matplotlib.get_backend()
        assert main(["compare", "--gpu", "a100", "--out", {str(tmp_path)!r}, "--jobs", "1"]) == 0
        assert matplotlib.get_backend() == "pdf", matplotlib.get_backend()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list(tmp_path.glob("*.png"))) == 4


# ----------------------------------------------------------------- report folders


def pngs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.png"))


def test_a_reused_report_folder_holds_this_builds_files_and_the_users(tmp_path, amd_report, capsys):
    out = tmp_path / "report"
    shutil.copytree(amd_report, out)  # a folder the tool wrote before, hidden files and all
    (out / "my-notes.txt").write_text("mine")
    assert "closed-loop.png" in pngs(out) and "tree-ablation.png" in pngs(out)
    assert build("--gpu", "a100", "--model", "llama-7b", "--out", str(out)) == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "closed-loop.png" not in pngs(out) and "tree-ablation.png" not in pngs(out)
    assert len(pngs(out)) == html.count("<img ") == 11, pngs(out)
    assert (out / "my-notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        [*pngs(out), "report.html", "my-notes.txt"]
    )


def test_an_interrupted_build_leaves_the_folder_as_it_was(tmp_path, monkeypatch, capsys, a100_report):
    out = tmp_path / "report"
    shutil.copytree(a100_report, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("reports.build.inputs_section", interrupted)  # the last section, after every figure
    # another workload: a page and capacity figures of its own, the other figures as the folder's
    assert build("--gpu", "a100", "--model", "llama-7b", "--response-len", "128", "--out", str(out)) == 130
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before
    assert [p.name for p in out.iterdir() if p.is_dir()] == []  # no staging folder left behind


@pytest.mark.parametrize("command", ["build", "compare"])
def test_an_unwritable_out_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the output folder was checked")

    monkeypatch.setattr("reports.build.load_inputs", no_work)
    monkeypatch.setattr("reports.compare.load_model", no_work)
    for out in (blocker, blocker / "report"):
        args = ["--gpu", "a100", "--model", "llama-7b", "--out", str(out), "--jobs", "1"]
        with pytest.raises(SystemExit) as exit_:  # refused as the command line is read
            run(main, [command, *args])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "error: " in err and str(blocker) in err, err
    assert blocker.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits; the file case above covers it")
def test_a_read_only_out_is_one_line(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert build("--gpu", "a100", "--model", "llama-7b", "--out", str(locked)) == 1
    finally:
        locked.chmod(0o755)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot write the report folder" in err and str(locked) in err
