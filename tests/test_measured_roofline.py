import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from perfmodel.cli import run
from perfmodel.hardware.specs import find_spec
from perfmodel.latency.roofline import predict_table
from perfmodel.measured import store as measurements
from perfmodel.measured.contract import read_table, write_table
from perfmodel.measured.store import HOME_VARIABLE, meta_path, user_measurements_dir
from perfmodel.models.config import load_model
from perfmodel.models.operators import DEFAULT_OPS
from profilers.device import cpu_info
from profilers.store import write_meta
from reports.commands.roofline import main
from tests.helpers import assert_png_shows_a_plot, time_quickly

GRID = ["--batch", "1", "2", "--seq", "32", "--candidates", "1", "8", "--jobs", "1"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "tiny"
    folder.mkdir()
    config = dict(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=100,
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def measured_cpu(tmp_path_factory, tiny_model):
    """`--gpu cpu --measure` once: a real sweep of this CPU (tiny shapes) and its ceilings."""
    out = tmp_path_factory.mktemp("cpu-roofline")
    with pytest.MonkeyPatch.context() as patch:  # what the test reads is that they are measured and drawn
        patch.setenv(HOME_VARIABLE, str(out / "home"))
        time_quickly(patch)
        assert run(main, ["--gpu", "cpu", "--measure", "--model", str(tiny_model), "--out", str(out), *GRID]) == 0
    return out


def test_measure_draws_measured_points_under_measured_ceilings(measured_cpu):
    table = read_table(measured_cpu / "roofline.csv")
    measured = table[table["source"] == "measured"]
    key = cpu_info().key
    # every default op (linear ones and sdpa) in 2 models x (prefill, decode, 2 tree sizes)
    assert len(measured) == len(DEFAULT_OPS) * 2 * (1 + 1 + 2) and set(measured["device"]) == {key}
    assert (measured["time_s"] > 0).all()
    page = (measured_cpu / "roofline.html").read_text()
    assert f"Measured ceilings of {key}" in page and "bandwidth (read)" in page and "matmul fp32" in page
    assert "datasheet" not in page.split("Ceilings and latency model")[1].split("</table>")[0]  # a CPU has none
    assert page.count('class="tag measured"') == 4  # every figure shows measured data
    for png in measured_cpu.glob("*.png"):
        assert_png_shows_a_plot(png)
    assert "Prediction error" in page


def test_ceilings_are_recorded_with_the_run(measured_cpu):
    (run,) = json.loads(meta_path(stored_tiny_sweep(measured_cpu)).read_text())["runs"].values()
    ceilings = run["ceilings"]
    assert set(ceilings["bandwidth_gb_s"]) == {"copy", "triad", "read"}
    assert all(0.5 < gb_s < 10_000 for gb_s in ceilings["bandwidth_gb_s"].values())
    assert set(ceilings["peak_tflops"]) == {"fp32", "bf16", "fp16"} and ceilings["peak_tflops"]["fp32"] > 0.001
    # a relative spread: never negative or undefined; its size is the machine's (on a loaded two-core box it passed 5)
    assert all(math.isfinite(n) and n >= 0 for n in ceilings["noise"].values())
    assert 0.05 < ceilings["kernel_overhead_us"] < 10_000  # one tiny op call: microseconds, never zero
    assert run["device"]["key"] == cpu_info().key and run["device"]["caches"]


def stored_tiny_sweep(measured: Path) -> Path:
    """Where --measure kept the tiny model's sweep: this machine's stored measurements."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(HOME_VARIABLE, str(measured / "home"))
        (path,) = (user_measurements_dir() / cpu_info().key).glob("tiny-*.csv")
    return path


def test_stored_measurements_are_found_by_device(measured_cpu, tiny_model, tmp_path, monkeypatch):
    key = cpu_info().key
    stored = tmp_path / "measurements"
    monkeypatch.setattr(measurements, "MEASUREMENTS_DIR", stored)
    sweep = stored_tiny_sweep(measured_cpu)
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path / "home"))
    out = tmp_path / "out"
    assert run(main, ["--gpu", "cpu", "--model", str(tiny_model), "--out", str(out), *GRID]) == 1  # nothing stored yet

    (stored / key).mkdir(parents=True)
    shutil.copy(sweep, stored / key / sweep.name)
    shutil.copy(meta_path(sweep), meta_path(stored / key / sweep.name))
    assert run(main, ["--gpu", "cpu", "--model", str(tiny_model), "--out", str(out), *GRID]) == 0
    assert (read_table(out / "roofline.csv")["source"] == "measured").sum() == len(read_table(sweep))


def test_no_stored_cpu_data_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(measurements, "MEASUREMENTS_DIR", tmp_path / "shipped")
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path / "home"))
    assert run(main, ["--gpu", "cpu"]) == 1
    err = capsys.readouterr().err
    assert f"no measurements of {cpu_info().key} are stored" in err and "no CPU measurements are stored" in err
    assert "python -m perfmodel.roofline --gpu cpu --measure" in err


def test_a_gpu_shows_its_stored_sweep_and_measured_ceilings(tmp_path, monkeypatch):
    """The shipped-data path for GPUs, with rows derived from predictions (a test input, not data)."""
    spec, model = find_spec("h100"), load_model("llama-7b")
    rows = predict_table(spec, model, "fp16").query("op in ['up', 'qk'] and batch <= 2")
    rows = rows.assign(time_s=rows["time_s"] * 1.1, source="measured", noise=0.005, run_id="r1")
    rows["tflops"] = rows["flops"] / rows["time_s"] / 1e12
    folder = tmp_path / "h100-sxm"
    write_table(rows, folder / "sweep-llama-7b-fp16.csv")
    ceilings = {
        "device": "h100-sxm",
        "bandwidth_gb_s": {"copy": 2900.0, "read": 3050.0},
        "peak_tflops": {"fp16": 720.0},
        "noise": {},
        "skipped": {},
        "measured_at": "test",
    }
    write_meta(
        folder / "sweep-llama-7b-fp16.csv",
        {
            "runs": {
                "r1": {
                    "device": {"key": "h100-sxm", "name": "NVIDIA H100 80GB HBM3"},
                    "ceilings": ceilings,
                    "started": 1,
                }
            }
        },
    )
    monkeypatch.setattr(measurements, "MEASUREMENTS_DIR", tmp_path)
    out = tmp_path / "out"
    assert run(main, ["--gpu", "h100", "--model", "llama-7b", "--out", str(out), "--jobs", "1"]) == 0
    page = (out / "roofline.html").read_text()
    ceilings_table = page.split("Ceilings and latency model")[1].split("</table>")[0]
    assert '<td class="text">measured</td><td class="num">720</td><td class="num">3050</td>' in ceilings_table
    assert 'class="tag measured"' in page and "datasheet" in page
    errors = pd.read_csv(out / "roofline.csv").query("source == 'measured'")
    assert len(errors) == len(rows)


def test_measure_needs_the_gpu_it_names(capsys):
    assert run(main, ["--gpu", "h100", "--measure"]) == 1
    assert "no CUDA device is visible" in capsys.readouterr().err
