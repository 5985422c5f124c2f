import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml

from hw_specs import SPEC_DIR
from perfmodel.cli import run
from perfmodel.latency.roofline import predict_table
from perfmodel.latency.source import view_latency
from perfmodel.measured.contract import read_table, write_table
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.models.grid import Grid
from perfmodel.models.operators import DEFAULT_OPS
from reports.commands.roofline import main
from tests.helpers import assert_png_shows_a_plot, number, parse_page, run_here

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "llama-7b", "--batch", "1", "16", "--seq", "1024", "--candidates", "1", "64", "--jobs", "1"]


class SourceCollector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls, self.images = [], 0

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href"):
                self.urls.append(value)
        self.images += tag == "img"


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "perfmodel.roofline", *args], cwd=cwd, capture_output=True, text=True)


def test_default_command_writes_the_papers_figures(tmp_path):
    result = cli("--gpu", "a100", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == [
        "medusa-attention-b16-llama-33b.png",
        "medusa-attention-s1024-llama-33b.png",
        "medusa-up-gate-down-llama-33b.png",
        "roofline-llama-13b.png",
        "roofline-llama-33b.png",
        "roofline-llama-7b.png",
    ]
    for png in tmp_path.glob("*.png"):
        assert_png_shows_a_plot(png)
    table = read_table(tmp_path / "roofline.csv")
    assert len(table) == 3 * len(DEFAULT_OPS) * (49 + 49 + 49 * 8)  # every op incl. sdpa, every grid point
    assert set(table["source"]) == {"predicted"} and set(table["device"]) == {"a100-pcie"}
    page = (tmp_path / "roofline.html").read_text()
    links = SourceCollector()
    links.feed(page)
    assert links.images == 6
    assert all(url.startswith("data:image/png;base64,") for url in links.urls)
    # the spec's values with their sources
    device = parse_page(page).section("Device").table("field", "value", "source")
    fields = {r["field"]: r for r in device.records()}
    spec = yaml.safe_load((SPEC_DIR / "a100-pcie.yaml").read_text())
    assert number(fields["memory_bandwidth_gb_s"]["value"]) == number(str(spec["memory_bandwidth_gb_s"])) == 1935
    assert "nvidia-a100-datasheet" in fields["memory_bandwidth_gb_s"]["source"]
    assert len(page) < 5_000_000


def test_custom_spec_and_strings_are_escaped(tmp_path):
    data = yaml.safe_load((SPEC_DIR / "h100-sxm.yaml").read_text())
    data["name"] = "<script>alert(1)</script> GPU"
    spec = tmp_path / "evil.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert run(main, ["--spec", str(spec), "--out", str(tmp_path / "out"), *SMALL]) == 0
    page = (tmp_path / "out" / "roofline.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; GPU" in page


def test_measured_rows_are_overlaid_and_their_error_reported(tmp_path):
    out = tmp_path / "out"
    # the datasheet roofline's predictions, so that measured rows given later are compared with them
    # (under --latency auto, given measurements become the prediction itself)
    small_datasheet = [*SMALL, "--latency", "datasheet"]
    assert run(main, ["--gpu", "h100", "--out", str(out), *small_datasheet]) == 0
    predicted = read_table(out / "roofline.csv")
    measured = predicted[predicted["op"].isin(["up", "qk"])].copy()
    measured["time_s"] *= 1.25  # the prediction is 20% fast on every row
    measured["tflops"] = measured["flops"] / measured["time_s"] / 1e12
    measured["source"], measured["noise"], measured["run_id"] = "measured", 0.01, "test-run"
    write_table(measured, tmp_path / "measured.csv")

    out2 = tmp_path / "out2"
    assert (
        run(
            main,
            ["--gpu", "h100", "--out", str(out2), "--measurements", str(tmp_path / "measured.csv"), *small_datasheet],
        )
        == 0
    )
    table = read_table(out2 / "roofline.csv")
    assert (table["source"] == "measured").sum() == len(measured)
    page = (out2 / "roofline.html").read_text()
    parsed = parse_page(page)
    section = parsed.section("Prediction error")
    errors = section.table("op", "phase", "rows", "median_error", "min_error", "max_error")
    assert set(errors.column("op")) == {"up", "qk"} and sum(errors.numbers("rows")) == len(measured)
    # the prediction is 20% fast on every row: every error is -20.0%, signed (not +20.0%, not |20.0%|)
    assert any("(predicted - measured) / measured, signed" in p for p in section.paragraphs)
    for column in ("median_error", "min_error", "max_error"):
        assert errors.column(column) == ["-20.0%"] * len(errors.rows)
    assert any("measured" in f.badges for f in parsed.figures())


def test_narrowed_grid_csv_path(tmp_path):
    csv = tmp_path / "elsewhere" / "grid.csv"
    assert run(main, ["--gpu", "rtx-4090", "--out", str(tmp_path), "--csv", str(csv), "--dtype", "bf16", *SMALL]) == 0
    table = read_table(csv)
    assert set(table["batch"]) == {1, 16} and set(table["seq_len"]) == {1024} and set(table["dtype"]) == {"bf16"}
    assert set(table.loc[table["phase"] == "tree", "candidates"]) == {1, 64}
    assert len(table) == len(DEFAULT_OPS) * (2 + 2 + 4)


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["--gpu", "a10O"], 1, "unknown device 'a10O'"),
        (["--gpu", "a100", "--model", "llama-8b"], 1, "unknown model 'llama-8b'"),
        (["--gpu", "a100", "--batch", "-4"], 2, "must be a positive integer, got '-4'"),
        (["--gpu", "a100", "--dtype", "fp12"], 1, "unknown dtype 'fp12'"),
        (["--gpu", "a100", "--dtype", "fp8"], 1, "no fp8 peak"),
        (["--spec", "/nonexistent/my_gpu.yaml"], 1, "cannot read spec file /nonexistent/my_gpu.yaml"),
        (["--gpu", "a100", "--measurements", "/nonexistent.csv"], 1, "does not exist"),
        ([], 2, "one of the arguments --gpu --spec is required"),
    ],
)
def test_bad_input_is_one_clear_line(args, status, message, capsys):
    result = run_here(main, args, capsys)
    assert result.status == status
    assert message in result.err
    assert "Traceback" not in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_bad_input_from_the_command_line_is_one_clear_line():
    result = cli("--gpu", "a10O")
    assert result.returncode == 1 and result.stderr.startswith("error: unknown device 'a10O'")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_measurement_file_must_follow_the_contract(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("op,time\nqk,1\n")
    result = run_here(main, ["--gpu", "a100", "--measurements", str(bad)], capsys)
    assert result.status == 1 and "missing column(s) device" in result.err


# The figures' code is the same for every device: it is drawn end to end on one device of each
# memory class and generation, and every device's roofline table is priced below.
DRAWN = ("a100-sxm", "rtx-4090", "b200")


@pytest.mark.parametrize("device", DRAWN)
def test_a_device_of_each_kind_draws(tmp_path, device):
    assert run(main, ["--gpu", device, "--out", str(tmp_path), *SMALL]) == 0
    assert len(list(tmp_path.glob("*.png"))) == 4
    assert np.isfinite(read_table(tmp_path / "roofline.csv")["tflops"]).all()


@pytest.mark.parametrize("device", sorted(p.stem for p in SPEC_DIR.glob("*.yaml")))
def test_every_device_prices_its_roofline(device):
    (view,) = resolve_devices([device])
    model, dtype = load_model("llama-7b"), "fp16"
    latency = view_latency(view, model, dtype)
    grid = Grid(batches=(1, 16), seq_lens=(1024,), candidates=(1, 64))
    table = predict_table(view.spec, model, dtype, grid, ops=DEFAULT_OPS, params=view.params, latency=latency)
    assert len(table) and np.isfinite(table["tflops"]).all() and (table["time_s"] > 0).all()
