"""python -m reports: self-contained pages with every figure visible, strings escaped,
predicted and measured labelled, and the numbers a person acts on."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from browser import loaded_page, screenshot
from PIL import Image

from perfmodel.acceptance.rates import ACCEPTANCE_PRESETS
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import load_model
from perfmodel.planning import simulations
from perfmodel.planning.drafter_choice import best_drafters
from perfmodel.planning.drafter_choice import cell as drafter_cell
from perfmodel.planning.drafters import DRAFTER_NAMES, drafters_for
from reports.__main__ import main
from reports.sources import ReportAcceptance, report_acceptance, report_drafters
from tests.conftest import deploy
from tests.helpers import ParsedPage, Table, assert_in_order, custom_spec, number, numbers, parse_page

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "decoder" / "assets" / "bundled"
SHIPPED_CLOSED_LOOP = ROOT / "profilers" / "measurements" / "cpu-intel-xeon-processor-2c" / "closed-loop"
MAX_BYTES = 5_000_000
SECTIONS = [
    "The answer",
    "At a glance",
    "Device",
    "Ceilings and latency model",
    "Rooflines: ",
    "",  # "<model>: Medusa tree decoding variations"
    "Speedup",
    "Drafters",
    "Acceptance",
    "Recommended tree",
    "Tree ablation",
    "Capacity planning",
    "Prediction error",
    "Inputs",
]
PERCENT = re.compile(r"[+-]\d+\.\d%")


@pytest.fixture(scope="module")
def a100(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("a100")
    # the datasheet roofline: its optimum (160) lies past the reference tree, which the report caps at 64
    assert main(["build", "--gpu", "a100", "--model", "llama-7b", "--latency", "datasheet", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def bundled_cpu(tmp_path_factory) -> Path:
    """This CPU and the bundled model: measured ceilings, acceptance record, closed loop."""
    out = tmp_path_factory.mktemp("cpu")
    assert main(["build", "--gpu", "cpu-intel-xeon-processor-2c", "--model", str(BUNDLED), "--out", str(out)]) == 0
    return out


def attributes(html: str, name: str) -> list[str]:
    return re.findall(rf'\b{name}="([^"]*)"', html)


def headings(html: str) -> list[str]:
    return re.findall(r"<h2[^>]*>([^<]*)</h2>", html)


def check_self_contained(page: Path) -> str:
    html = page.read_text(encoding="utf-8")
    assert page.stat().st_size < MAX_BYTES, f"{page} is {page.stat().st_size:,} bytes"
    sources = attributes(html, "src")
    assert sources and all(s.startswith(("data:image/png;base64,", "data:image/svg+xml;base64,")) for s in sources)
    assert all(h.startswith("#") for h in attributes(html, "href")), "only in-page links"
    assert "<script" not in html and "<link" not in html and "@import" not in html and "url(" not in html
    for svg in embedded_svgs(html):  # nothing inside an SVG reaches out either: links to itself, images inline
        assert "<script" not in svg and not re.search(r'href="(?!#|data:image/png;base64,)', svg)
    return html


def embedded_svgs(html: str) -> list[str]:
    return [
        base64.b64decode(uri.split(",", 1)[1]).decode("utf-8")
        for uri in attributes(html, "src")
        if uri.startswith("data:image/svg+xml")
    ]


def read_page(path: Path) -> ParsedPage:
    return parse_page(path.read_text(encoding="utf-8"))


def optimum(optima: Table, simulation: str, step: str) -> dict[str, str]:
    """The optimum of simulation (a), one row per step model."""
    rows = [r for r in optima.records() if r["simulation"] == simulation and r["step"] == step]
    assert len(rows) == 1, rows
    return rows[0]


def first_losing_batch(rows: list[dict[str, str]]) -> int | None:
    """The smallest batch from which on no tree beats plain decoding (tree size 1)."""
    batches = [(int(number(r["batch"])), number(r["tree_size"]) > 1) for r in rows]
    losing = [b for i, (b, _) in enumerate(batches) if not any(speculate for _, speculate in batches[i:])]
    return losing[0] if losing else None


def test_a100_report_is_self_contained_with_every_section(a100):
    html = check_self_contained(a100 / "report.html")
    pngs = sorted(p.name for p in a100.glob("*.png"))
    assert len(attributes(html, "src")) == len(pngs) == 11
    for name in (
        "roofline-llama-7b",
        "medusa-attention-b16-llama-7b",
        "speedup-a-b1-s1024",
        "acceptance",
        "recommended-tree",
        "capacity",
    ):
        assert f"{name}.png" in pngs
    # the rooflines' clouds of points as PNG; every other figure as SVG where that is smaller than its PNG
    kinds = re.findall(r'<img src="data:image/([a-z+]+);base64,', html)
    assert kinds[:4] == ["png"] * 4  # the rooflines come first
    svgs = embedded_svgs(html)
    assert len(svgs) == 7 and all("<text" in svg for svg in svgs)  # text kept as text: small, sharp, searchable
    pngs_after = sorted((a100 / p).stat().st_size for p in pngs if not p.startswith(("roofline", "medusa-")))
    assert sum(len(svg) for svg in svgs) < 0.6 * sum(pngs_after)
    page = parse_page(html)
    assert page.headings[1:] == page.contents, "the contents list every section after the answer, in order"
    assert len(page.headings) == len(SECTIONS)
    assert_in_order(page.headings, SECTIONS)
    assert page.headings[5] == "llama-7b: Medusa tree decoding variations"
    # nothing measured for an A100 here: every figure carries the predicted badge, none measured
    assert len(page.figures()) == 11 and all(f.badges == ["predicted"] for f in page.figures())
    assert 'class="tag measured"' not in html
    errors = page.section("Prediction error")
    assert not errors.tables and len(errors.notes) == 1
    device = page.section("Device").table("field", "value", "source")
    sources = dict(zip(device.column("field"), device.column("source")))
    assert "nvidia-a100-datasheet" in sources["memory_bandwidth_gb_s"]  # the spec's values with their sources
    spec = yaml.safe_load((ROOT / "hw_specs" / "a100-pcie.yaml").read_text())
    assert dict(zip(device.column("field"), device.numbers("value")))["memory_bandwidth_gb_s"] == number(
        str(spec["memory_bandwidth_gb_s"])
    )


def test_glance_numbers_are_the_tables(a100, bundled_cpu):
    """Each "At a glance" fact repeats numbers of the tables below it: ridge, best tree and
    speedup per step model, where speculation stops paying, the recommended batch."""
    for folder in (a100, bundled_cpu):
        page = read_page(folder / "report.html")
        glance = page.section("At a glance").bullets
        closed_loop = bool(page.section("Prediction error").tables)
        # measured first: the closed loop and why the predictions differ; then ridge, (a) and (b) per step
        # model and capacity, each without the note added where the measurement disagrees
        assert len(glance) == 6 + 2 * closed_loop
        assert glance[0].startswith("Measured (closed loop") == closed_loop
        glance = [fact.split(" (predicted")[0] for fact in glance[2 * closed_loop :]]
        ceilings = page.section("Ceilings").tables[0]
        ridges = dict(zip(ceilings.column("ceiling"), ceilings.numbers("ridge FLOP/byte")))
        assert numbers(glance[0])[0] == round(ridges.get("model", ridges.get("measured")))
        optima = page.section("Speedup").table("simulation", "step", "batch", "tree_size", "speedup")
        for (best, per_batch), step in zip((glance[1:3], glance[3:5]), ("paper", "full")):
            row = optimum(optima, "a", step)
            said = numbers(best)
            assert said[:2] == [1, 1024] and number(row["tree_size"]) in said
            assert any(abs(x - number(row["speedup"])) < 0.006 for x in said), (best, row)
            rows = [r for r in optima.records() if r["simulation"] == "b" and r["step"] == step]
            lost = first_losing_batch(rows)
            assert numbers(per_batch)[-1] == (lost or max(number(r["batch"]) for r in rows)), per_batch
        bands = page.section("Capacity planning").table("batch", "tree", "per_token_ms", "total_tokens_s")
        chosen = max(
            (r for r in bands.records() if r["meets_latency"] == "True"), key=lambda r: number(r["total_tokens_s"])
        )
        said = numbers(glance[5])
        assert number(chosen["batch"]) in said and round(number(chosen["total_tokens_s"])) in said
        assert round(number(chosen["per_token_ms"]), 1) in said
        assert (chosen["tree"] == "none") == ("no tree" in glance[5])


def test_recommended_tree_is_the_speedup_models_optimum_capped_at_the_reference_tree(a100):
    page = read_page(a100 / "report.html")
    optima = page.section("Speedup").table("simulation", "step", "batch", "tree_size", "speedup")
    section = page.section("Recommended tree")
    summary, text = section.preformatted[0]
    exports = dict(re.findall(r"([\w-]+):\n(\[.*\])", text))
    assert list(exports) == ["reference", "tensorrt-llm", "vllm"]
    paths = json.loads(exports["reference"])
    assert numbers(summary)[0] == len(paths) and all(len(json.loads(e)) == len(paths) for e in exports.values())
    # the paper preset has no head accuracies: the Vicuna-7B tree's own first nodes, cut at its 64 tokens
    wanted = number(optimum(optima, "a", "full")["tree_size"])
    assert wanted == 160 and len(paths) + 1 == 64
    assert section.figures[0].badges == ["predicted"] and {160, 64} <= set(numbers(section.figures[0].alt))
    # the best tree per batch is simulation (b) of the whole-model step
    per_batch = section.table("batch", "tree_size", "speedup", "speculate")
    rows = [r for r in optima.records() if r["simulation"] == "b" and r["step"] == "full"]
    assert per_batch.column("batch") == [r["batch"] for r in rows]
    assert per_batch.column("tree_size") == [r["tree_size"] for r in rows]
    assert per_batch.column("speculate") == [str(n > 1) for n in per_batch.numbers("tree_size")]
    # the paper's curve read as log2 (docs/acceptance.md): trees pay through batch 32, as its Appendix G.3 says
    assert first_losing_batch(per_batch.records()) == 64


def test_variation_tables_give_tflops_and_intensity_per_candidates(a100):
    section = read_page(a100 / "report.html").section("llama-7b: Medusa tree decoding variations")
    variations = [t for t in section.tables if t.columns[:3] == ["op", "batch", "seq_len"]]
    points = [t for t in section.tables if "intensity" in t.columns]
    assert len(variations) == len(points) == len(section.figures) == 3  # paper Tables 6-8, one per figure
    for table, shown in zip(variations, points):
        assert table.columns[3:] == [f"q={q}" for q in (1, 16, 32, 48, 64, 80, 96, 112)]
        assert number(shown.summary) == len(shown.rows) > 0
        # a cell is "TFLOP/s (intensity)" of the figure's point at that q
        for row in table.records():
            for column in table.columns[3:]:
                match = re.fullmatch(r"([\d.e+-]+) \(([\d.e+-]+)\)", row[column])
                assert match, row[column]
                point = [
                    p
                    for p in shown.records()
                    if (p["op"], p["batch"], p["seq_len"], p["candidates"])
                    == (row["op"], row["batch"], row["seq_len"], column[2:])
                ]
                assert len(point) == 1
                assert float(match.group(1)) == pytest.approx(number(point[0]["tflops"]), rel=5e-3)
                assert float(match.group(2)) == pytest.approx(number(point[0]["intensity"]), rel=5e-3)
    # QK^T at s=1024, q=64 has the paper's 40.96 FLOP/byte
    qk = [r for r in variations[0].records() if (r["op"], r["batch"], r["seq_len"]) == ("qk", "16", "1024")]
    assert qk and all(numbers(r["q=64"])[1] == 41 for r in qk)


def test_figures_are_drawn_not_blank(a100, png_shows_a_plot):
    for png in a100.glob("*.png"):
        png_shows_a_plot(png)
        pixels = np.asarray(Image.open(png).convert("L"), dtype=float)
        assert pixels.shape[1] >= 800, f"{png.name} too small to read"
        assert (pixels < 200).mean() > 0.01, f"{png.name} is nearly blank"


def test_measured_inputs_are_shown_and_compared(bundled_cpu):
    html = check_self_contained(bundled_cpu / "report.html")
    page = parse_page(html)
    assert (bundled_cpu / "closed-loop.png").exists()
    # the acceptance record and the closed loop: measured data with the predictions against them
    assert page.section("Acceptance").figures[0].badges == ["measured", "predicted"]
    assert page.section("Speedup").figures[0].badges == ["measured", "predicted"]  # measured first
    errors = page.section("Prediction error")
    assert len(errors.tables) == 2 and not errors.notes

    # acceptance: the record's tokens per step per tree size, each fit's prediction and its error
    record = json.loads((BUNDLED / "acceptance-greedy.json").read_text())
    fits = errors.table("tree_size", "measured_tokens_per_step", "log_fit_error", "head_accuracy_error")
    assert fits.numbers("tree_size") == [r["tree_size"] for r in record["per_tree_size"]]
    measured = np.array(fits.numbers("measured_tokens_per_step"))
    expected = [r["mean_accepted_tokens"] for r in record["per_tree_size"]]
    assert measured == pytest.approx(expected, rel=1e-3)
    for fit in ("log_fit", "head_accuracy"):
        assert all(PERCENT.fullmatch(cell) for cell in fits.column(f"{fit}_error"))
        predicted = np.array(fits.numbers(f"{fit}_predicted"))
        assert fits.numbers(f"{fit}_error") == pytest.approx((predicted - measured) / measured, abs=1e-3)

    # the shipped closed loop: predicted vs measured speedup per tree size, its error as a percentage
    (csv,) = SHIPPED_CLOSED_LOOP.glob("*bundled*.csv")
    shipped = pd.read_csv(csv)
    loop = errors.table("tree_size", "measured_speedup", "predicted_speedup", "error")
    assert len(loop.rows) == len(shipped) and loop.numbers("tree_size") == list(shipped["tree_size"])
    assert loop.numbers("measured_speedup") == pytest.approx(list(shipped["measured_speedup"]), rel=1e-3)
    assert loop.numbers("predicted_speedup") == pytest.approx(list(shipped["predicted_speedup"]), rel=1e-3)
    assert all(PERCENT.fullmatch(cell) for cell in loop.column("error"))
    assert loop.numbers("error") == pytest.approx(list(shipped["error"]), abs=5e-4)
    glance = page.section("At a glance").bullets
    signed = numbers(glance[1].split("an error of ")[1])[:2]  # the closed loop's own error, signed
    assert signed == pytest.approx([shipped["error"].min(), shipped["error"].max()], abs=5e-4)
    inputs = {b.split(":")[0]: b for b in page.section("Inputs").bullets}
    assert csv.name in inputs["Closed-loop runs"] and "acceptance-greedy.json" in inputs["Acceptance"]

    # the paper's Fig. 4 on the bundled model: measured on another CPU, which the section says
    (ablation_csv,) = (ROOT / "profilers" / "measurements").glob("*/tree-ablation/*bundled*.csv")
    ablation = page.section("Tree ablation")
    assert ablation.figures[0].badges == ["measured", "predicted"] and (bundled_cpu / "tree-ablation.png").exists()
    trees = ablation.table("kind", "setting", "nodes", "measured_acceptance", "acceptance_error")
    assert len(trees.rows) == len(pd.read_csv(ablation_csv))
    assert ablation_csv.parent.parent.name in ablation.paragraphs[0] and "not on this device" in ablation.paragraphs[0]
    assert ablation_csv.name in inputs["Tree ablation"]

    # the shipped sweep is of llama-7b: named as an input, not used for the bundled model's operators
    rooflines = [s for s in page.sections if s.heading.startswith("Rooflines") or "variations" in s.heading]
    assert len(rooflines) == 2 and all(f.badges == ["predicted"] for s in rooflines for f in s.figures)
    assert {p for s in rooflines for t in s.tables if "source" in t.columns for p in t.column("source")} == {
        "predicted"
    }
    assert ".csv" in inputs["Operator measurements"] and "llama-7b" in inputs["Operator measurements"]
    assert "/work/" not in html and str(Path.home()) + "/" not in html


def test_operator_errors_where_a_sweep_meets_predictions(tmp_path):
    assert (
        main(
            [
                "build",
                "--gpu",
                "cpu-intel-xeon-processor-2c",
                "--model",
                "llama-7b",
                "--acceptance",
                "paper",
                "--tp",  # llama-7b in fp32 needs two of this CPU where its all-reduce was measured: auto takes them
                "auto",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    page = read_page(tmp_path / "report.html")
    errors = page.section("Prediction error").table("op", "phase", "rows", "median_error", "min_error", "max_error")
    assert errors.rows
    assert all(n >= 1 and n == int(n) for n in errors.numbers("rows"))
    for column in ("median_error", "min_error", "max_error"):
        assert all(PERCENT.fullmatch(cell) for cell in errors.column(column))
    lows, medians, highs = (errors.numbers(c) for c in ("min_error", "median_error", "max_error"))
    assert all(lo <= m <= hi for lo, m, hi in zip(lows, medians, highs))
    keys = list(zip(errors.column("op"), errors.column("phase")))
    assert len(set(keys)) == len(keys) and set(errors.column("phase")) <= {"prefill", "decode", "tree"}
    # the measured points are drawn over the predictions, and every measured op drawn has its error
    roofline = [s for s in page.sections if s.heading.startswith("Rooflines") or "variations" in s.heading]
    drawn = [f for s in roofline for f in s.figures]
    assert len(drawn) >= 4 and all(f.badges == ["measured", "predicted"] for f in drawn)
    points = [p for s in roofline for t in s.tables if "source" in t.columns for p in t.records()]
    measured = {(p["op"], p["phase"]) for p in points if p["source"] == "measured"}
    assert measured and measured <= set(keys)


def test_every_string_is_escaped_and_the_spec_file_is_named_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    path = custom_spec(tmp_path / "specs", name="<script>alert('x')</script> & co", aliases=None)
    assert main(["build", "--spec", "specs/my_gpu.yaml", "--model", "llama-7b", "--out", "r", "--jobs", "1"]) == 0
    html = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    assert "<script>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in html
    device = next(b for b in parse_page(html).section("Inputs").bullets if b.startswith("Device:"))
    assert f"spec {path.relative_to(tmp_path)}" in device and "hw_specs" not in device


def test_bad_input_names_the_value(tmp_path, capsys):
    from perfmodel.cli import run

    assert run(main, ["build", "--gpu", "a1000", "--model", "llama-7b", "--out", str(tmp_path)]) == 1
    assert "a1000" in capsys.readouterr().err
    assert run(main, ["build", "--gpu", "a100", "--model", "llama-7b", "--dtype", "fp8", "--out", str(tmp_path)]) == 1
    assert "fp8" in capsys.readouterr().err
    assert (
        run(
            main,
            [
                "build",
                "--gpu",
                "a100",
                "--model",
                "llama-7b",
                "--acceptance",
                str(tmp_path / "none.json"),
                "--out",
                str(tmp_path),
            ],
        )
        == 1
    )
    assert "none.json" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("tree_size,speedup\n2,1.1\n")
    assert (
        run(main, ["build", "--gpu", "a100", "--model", "llama-7b", "--validation", str(bad), "--out", str(tmp_path)])
        == 1
    )
    err = capsys.readouterr().err
    assert "bad.csv" in err and "--csv" in err


def test_compare_puts_devices_side_by_side(tmp_path, capsys):
    assert (
        main(
            ["compare", "--gpu", "a100", "a40", "rtx-a6000", "h100", "--model", "llama-7b", "--out", str(tmp_path)]
            + ["--latency", "datasheet"]  # every device on its datasheet, so the four compare like for like
        )
        == 0
    )
    html = check_self_contained(tmp_path / "compare.html")
    assert len(list(tmp_path.glob("*.png"))) == len(attributes(html, "src")) == 4
    assert headings(html)[:5] == [
        "The answer",
        "Ceilings",
        "Decode latency",
        "Best tree and speedup per batch",
        "Capacity planning",
    ]
    header = re.search(
        r"<th[^>]*>batch</th>((?:<th[^>]*>[^<]+</th>)+)</tr></thead><tbody><tr><td[^>]*>1</td><td[^>]*>n(=|&gt;=)", html
    )
    assert header, "no best-tree-per-batch table"
    assert re.findall(r">([^<]+)</th>", header.group(1)) == ["a100-pcie", "a40", "rtx-a6000", "h100-sxm"]
    out = capsys.readouterr().out
    for device in ("a100-pcie", "a40", "rtx-a6000", "h100-sxm"):
        assert re.search(
            rf"{device}: plain step \d+\.\d+ ms at b=1, s=1024; best tree (>= )?\d+ \(\d\.\d\dx\) at b=1", out
        )
    # the H100's best tree at b=1 is the largest searched: a bound, not an optimum
    assert "h100-sxm: plain step" in out and "best tree >= 256" in out
    # the faster memory of an H100 gives a shorter plain step than an A40's
    steps = dict(re.findall(r"(\S+): plain step (\d+\.\d+) ms", out))
    assert float(steps["h100-sxm"]) < float(steps["a100-pcie"]) < float(steps["a40"])
    # the page opens with the answer: the device with the most tokens/s, and a decision-map row per device
    page = parse_page(html)
    answer = page.section("The answer")
    plans = page.section("Capacity planning").table("device", "total_tokens_s", "max_batch")
    fastest = max(plans.records(), key=lambda r: number(r["total_tokens_s"]))
    assert answer.paragraphs[0].startswith(
        f"Capacity plan (predicted): Most tokens/s per replica: {fastest['device']} "
    )
    check_device_map(answer, ["a100-pcie", "a40", "rtx-a6000", "h100-sxm"], plans)


def check_device_map(answer, devices: list[str], plans: Table, dtype: str | None = None) -> None:
    """One row per device, one column per batch band at the workload's context (640 tokens):
    the device's own schedule there, or no room past its largest batch."""
    from perfmodel.planning.schedule import speculation_schedule

    table = answer.table("device \\ batch")
    assert table.column("device \\ batch") == devices
    assert table.columns[1:4] == ["1", "2-3", "4-7"] and table.columns[-1] == "256+"
    rooms = dict(zip(plans.column("device"), plans.numbers("max_batch")))
    for row in table.records():
        key = row["device \\ batch"].split()[0]
        tp = int(row["device \\ batch"].split(" x")[1]) if " x" in row["device \\ batch"] else 1
        schedule = speculation_schedule("llama-7b", key, tensor_parallel=tp, dtype=dtype, latency="datasheet")
        for label in table.columns[1:]:
            batch = int(number(label))
            band = schedule.band(batch, 640)
            expected = f"tree {band.tree_size} · {band.speedup:.2f}x D" if band.tree_size > 1 else "off D"
            assert row[label] == ("no room" if batch > rooms[key] else expected), (key, label)


def test_compare_skips_devices_without_the_dtype(tmp_path, capsys):
    args = ["--gpu", "a100", "h100", "--model", "llama-7b", "--dtype", "fp8", "--out", str(tmp_path)]
    assert main(["compare", *args, "--tp", "2", "--rate", "8", "--latency", "datasheet"]) == 0
    page = read_page(tmp_path / "compare.html")
    (skipped,) = page.sections[0].notes
    assert "a100-pcie" in skipped and "fp8" in skipped
    assert page.section("Ceilings").tables[0].column("device") == ["h100-sxm"]
    assert page.section("Best tree and speedup per batch").tables[0].columns == ["batch", "h100-sxm"]
    # the rate's answer at --tp 2: the devices it needs and the latencies at the 90th percentile
    answer = page.section("The answer")
    capacity = next(p for p in answer.paragraphs if p.startswith("Capacity at 8 requests/s"))
    assert re.search(r"h100-sxm tp 2, Medusa \w+: \d+ devices .* p90 TTFT [\d.]+ ms, p90 TPOT [\d.]+ ms", capacity)
    plans = page.section("Capacity planning").table("device", "total_tokens_s", "max_batch")
    check_device_map(answer, ["h100-sxm x2"], plans, "fp8")


def test_report_renders_in_a_real_browser(a100, bundled_cpu, tmp_path):
    for folder in (a100, bundled_cpu):
        page = folder / "report.html"
        shown = loaded_page(page)
        images = shown["images"]
        assert len(images) == len(list(folder.glob("*.png")))
        broken = [i["alt"][:60] for i in images if not (i["complete"] and i["natural"] > 0)]
        assert not broken, f"broken images: {broken}"
        small = [i["alt"][:60] for i in images if i["shown"] < 500]
        assert not small, f"figures shown too small to read: {small}"
        check_opens_with_the_answer(shown)
        check_drafters_table(shown)
        shot = np.asarray(Image.open(screenshot(page, tmp_path / f"{folder.name}.png")).convert("L"), dtype=float)
        # the top of the page: title, the answer and its map, contents; not a blank window
        assert (shot < 128).mean() > 0.02 and shot.std() > 20


def check_opens_with_the_answer(shown: dict) -> None:
    """As the browser lays the page out: the title, then the answer with its decision map
    (each cell a tree or off, coloured and keyed by its evidence, the workload's outlined),
    then the table of contents."""
    tags = [e["tag"] for e in shown["outline"]]
    answer = next(i for i, e in enumerate(shown["outline"]) if e["tag"] == "h2")
    assert tags[0] == "h1" and shown["outline"][answer]["text"] == "The answer"
    nav = tags.index("nav")
    assert answer < tags.index("table") < nav and tags[nav + 1 :].count("h2") == tags.count("h2") - 1
    assert shown["outline"][answer]["top"] < 400, "the answer starts on the first screen"
    header, *rows = shown["cells"]
    assert header[0]["text"] == "batch \\ context" and header[1]["text"].startswith("1-")
    cells = [c for row in rows for c in row[1:]]
    assert cells and all(re.fullmatch(r"(tree \d+ · \d+\.\d\dx|off) [A-Z]", c["text"]) for c in cells)
    assert all(re.search(r"\bev-[a-z-]+", c["cls"]) for c in cells)
    assert all(c["background"] not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)") for c in cells), "evidence colours"
    assert [c["outline"] for c in cells].count("solid") == 1, "one cell outlined: the workload's"


def check_drafters_table(shown: dict) -> None:
    """As the browser draws the drafters' table (the styled table after the decision map):
    every drafter's cell coloured by its evidence, one bold per row, the best drafter's."""
    header, *rows = shown["styled"][1]
    assert [c["text"] for c in header] == ["batch", *DRAFTER_NAMES.values(), "best drafter"]
    for row in rows:
        cells = row[1:-1]
        assert all(c["background"] not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)") for c in cells)
        bold = [name for name, c in zip(DRAFTER_NAMES.values(), cells) if int(c["weight"]) >= 600]
        assert bold == ([] if row[-1]["text"] == "off" else [row[-1]["text"]]), row


def answer_of(folder: Path, name: str = "report.html"):
    return read_page(folder / name).section("The answer")


def map_of(section) -> Table:
    return section.table("batch \\ context")


def test_the_page_opens_with_the_answer_and_its_decision_map(a100):
    html = (a100 / "report.html").read_text(encoding="utf-8")
    assert html.index("<h1>") < html.index(">The answer</h2>") < html.index("<nav>") < html.index(">At a glance</h2>")
    section = answer_of(a100)
    tree, capacity, _, key, *_ = section.paragraphs
    assert (
        workload_note(section)
        == "Workload: prompts 512 tokens, responses 256 tokens (average decoding context 640 tokens); Medusa auto."
    )
    # the capacity line is the plan's, and the tree is the map's cell at its batch and the workload's context
    glance = read_page(a100 / "report.html").section("At a glance").bullets
    assert capacity == glance[-1]
    batch = int(numbers(capacity.split("recommended batch")[1])[0])
    assert f"batch {batch} (the capacity plan's batch) and context 640" in tree and "predicted" in tree
    # the map is the speculation schedule of the page's step: rows of batches up to the largest that fits
    from perfmodel.planning.schedule import speculation_schedule
    from perfmodel.planning.schedule_bands import default_batches

    max_batch = int(number(capacity.split("max batch")[1]))
    schedule = speculation_schedule("llama-7b", "a100", latency="datasheet", batches=default_batches(max_batch))
    table = map_of(section)
    assert [int(number(b)) for b in table.column("batch \\ context")] == list(schedule.batch_grid)
    assert table.columns[1:] == ["1-1023", "1024-2047", "2048+"]
    for row, batch_ in zip(table.rows, schedule.batch_grid):
        for cell, context in zip(row[1:], schedule.context_grid):
            band = schedule.band(batch_, context)
            expected = f"tree {band.tree_size} · {band.speedup:.2f}x" if band.tree_size > 1 else "off"
            assert cell == f"{expected} D", (batch_, context)
    assert "predicted by the datasheet roofline" in key
    rests = dict(b.split(": ", 1) for b in section.bullets)
    assert rests["Decision map"].startswith("predicted in every cell")
    assert "datasheet" in rests["Step times"] and "not measured" in rests["Acceptance"]
    assert "Software stack of the step times" in rests
    assert rests["Launch regime of the step times"].startswith("kernels back to back")  # a GPU: which regime


def workload_note(section) -> str:
    (note,) = [n for n in section.notes if n.startswith("Workload:")]
    return note


def test_a_closed_loop_marks_its_cell_measured(bundled_cpu):
    section = answer_of(bundled_cpu)
    table = map_of(section)
    (csv,) = SHIPPED_CLOSED_LOOP.glob("*bundled*.csv")
    shipped = pd.read_csv(csv)
    assert set(shipped["batch"]) == {1} and shipped["context"].max() < 1024  # the first cell: batch 1, context 1-1023
    fastest = shipped.loc[shipped["measured_speedup"].idxmax()]
    assert table.rows[0][1] == f"tree {fastest['tree_size']} · {fastest['measured_speedup']:.2f}x M"
    # measured before predicted: the closed loop's cell is said first, then the recommendation
    measured, recommended = section.paragraphs[:2]
    assert measured.startswith("Measured (closed loop") and f"{fastest['measured_speedup']:.2f}x" in measured
    assert recommended.startswith("Recommended at batch") and "(predicted by the roofline" in recommended
    others = [cell for i, row in enumerate(table.rows) for j, cell in enumerate(row[1:]) if (i, j) != (0, 0)]
    assert all(cell.endswith(" R") for cell in others)  # predicted by the CPU's measured ceilings
    assert "measured in 1 cell(s) (M) by the closed loop" in section.bullets[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A workload with a rate, on two devices in tensor parallel: the serving simulation answers."""
    out = tmp_path_factory.mktemp("served")
    args = ["--gpu", "a100", "--model", "llama-7b", "--latency", "datasheet", "--tp", "2", "--rate", "4"]
    assert main(["build", *args, "--tpot-ms", "40", "--out", str(out)]) == 0
    return out


def test_a_rate_gets_the_devices_it_needs_and_their_latencies(served):
    from perfmodel.planning.workload import Targets, Workload
    from perfmodel.serving.capacity import serve
    from perfmodel.serving.summary import ms

    section = answer_of(served)
    assert workload_note(section).startswith("Workload: 4 requests/s, prompts 512 tokens, outputs 256 tokens")
    assert "p90 TPOT <= 40 ms" in workload_note(section)
    capacity = next(p for p in section.paragraphs if p.startswith("Capacity"))
    best = serve(
        "llama-7b", ["a100"], Workload(rate=4.0), Targets(tpot_s=0.04), tensor_parallel=2, latency="datasheet"
    ).best
    assert capacity.startswith("Capacity at 4 requests/s (predicted by simulating the engine")
    assert f"a100-pcie tp 2, Medusa {best.medusa}: {best.devices} devices" in capacity
    assert f"p90 TTFT {ms(best.ttft_p90_s)}" in capacity and f"p90 TPOT {ms(best.tpot_p90_s)}" in capacity
    assert f"({best.max_tokens_s:,.0f} tokens/s)" in capacity
    # --tp reaches the map and the plan below it
    assert any("a100-pcie x2 (tensor parallel)" in p for p in section.paragraphs)
    assert "on 2 devices in tensor parallel" in read_page(served / "report.html").section("At a glance").bullets[-1]
    batch = max(1, round(best.mean_batch))
    assert f"batch {batch} (the simulation's mean batch at 4 requests/s)" in section.paragraphs[0]


def test_tp_auto_with_a_rate_builds_the_page_of_the_serving_answers_degree(tmp_path, capsys):
    from perfmodel.planning.workload import Targets, Workload
    from perfmodel.serving.capacity import serve

    args = ["--gpu", "a100", "--model", "llama-7b", "--latency", "datasheet", "--tp", "auto", "--rate", "40"]
    assert main(["build", *args, "--tpot-ms", "30", "--out", str(tmp_path)]) == 0
    best = serve(
        "llama-7b", ["a100"], Workload(rate=40.0), Targets(tpot_s=0.03), tensor_parallel=None, latency="datasheet"
    ).best
    assert f"--tp auto: {best.tp} device(s) per replica, the serving simulation's choice" in capsys.readouterr().out
    capacity = next(p for p in answer_of(tmp_path).paragraphs if p.startswith("Capacity"))
    assert f"a100-pcie tp {best.tp}, Medusa {best.medusa}: {best.devices} devices" in capacity


def test_recommended_tree_comes_from_head_accuracies_when_measured():
    from perfmodel.acceptance.reference_trees import vicuna_7b_prefix
    from perfmodel.acceptance.trees import greedy_tree
    from reports.sources import recommended_tree, report_acceptance

    measured = report_acceptance(None, str(BUNDLED))  # the checkpoint's own record
    tree = recommended_tree(11, measured)
    assert tree.tree == greedy_tree(measured.record.head_topk_accuracy, 10) and tree.accuracy is not None
    paper = report_acceptance("paper", str(BUNDLED))
    assert recommended_tree(16, paper).tree == vicuna_7b_prefix(15)
    capped = recommended_tree(160, paper)
    assert capped.tree.size == 64 and capped.wanted == 160 and "160" in capped.note
    assert recommended_tree(1, paper) is None


def winner_runs(batches: list[int], winners: list[str]) -> list[tuple[str, int]]:
    """Each run of consecutive batches with one best drafter: (drafter, its first batch)."""
    return [(w, b) for i, (b, w) in enumerate(zip(batches, winners)) if i == 0 or winners[i - 1] != w]


def test_the_drafters_section_compares_them(a100):
    """Medusa heads, EAGLE and a draft model side by side: simulation (b) of the whole step,
    each drafter's best tree and speedup per batch as best_drafters finds them, the best
    drafter named, every cell keyed predicted, where each wins said, what each rests on."""
    page = read_page(a100 / "report.html")
    section = page.section("Drafters")
    assert page.headings[page.headings.index(section.heading) - 1].startswith("Speedup")
    by_batch = tuple(s for s in simulations.SIMULATIONS if s.key == "b")
    view, model = resolve_view("a100", None, []), load_model("llama-7b")
    sims = simulations.device_table(deploy(view, model, "fp16", "datasheet"), ("full",), drafters_for("all"), by_batch)
    rows = best_drafters(sims).sort_values("batch")
    table = section.table("batch", *DRAFTER_NAMES.values(), "best drafter")
    assert table.numbers("batch") == list(simulations.SIMULATION_BATCHES) == list(rows["batch"])
    assert table.column("best drafter") == [DRAFTER_NAMES.get(d, d) for d in rows["drafter"]]
    # every drafter's cell is its best tree and speedup, keyed D: predicted by the datasheet roofline
    for drafter, name in DRAFTER_NAMES.items():
        assert table.column(name) == [f"{drafter_cell(row, drafter)} D" for _, row in rows.iterrows()]
    assert "Key: D predicted by the datasheet roofline." in section.paragraphs
    # a100, llama-7b: EAGLE from batch 1, the draft model from batch 8 on; Medusa's heads never
    runs = winner_runs([int(b) for b in table.numbers("batch")], table.column("best drafter"))
    assert [name for name, _ in runs] == ["EAGLE", "draft model"]
    wins = next(p for p in section.paragraphs if p.startswith("Full step (whole model), context 1024"))
    said = [wins.find(f"{name} from batch {first}") for name, first in runs]  # each run where it begins, in order
    assert -1 not in said and said == sorted(said), wins
    assert wins.endswith("on (predicted). Fastest at no batch: the Medusa heads.")
    medusa, eagle, draft = section.bullets
    assert "Medusa paper" in medusa and "Spec-Bench" in eagle and "EAGLE-2" in eagle
    assert "alpha 0.7" in draft and "c = 0.05" in draft
    assert "through the origin" in section.notes[0]


def test_the_drafters_take_an_eagle_record_given_or_shipped(tmp_path):
    """An EAGLE record as the page's acceptance goes to EAGLE (Medusa keeps its preset); a
    checkpoint that ships one beside its own (Medusa) record gives it to EAGLE too."""
    runs = [{"tree_size": n, "mean_accepted_tokens": a} for n, a in ((4, 2.1), (16, 3.0), (60, 3.9))]
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    record = checkpoint / "acceptance-eagle.json"
    record.write_text(json.dumps({"drafter": "eagle", "per_tree_size": runs}))
    (checkpoint / "acceptance-broken.json").write_text("{")  # not a record: passed over
    paper = ReportAcceptance(ACCEPTANCE_PRESETS["paper"], None, None)
    medusa, eagle, draft = report_drafters(paper, str(checkpoint))
    assert medusa.choice is ACCEPTANCE_PRESETS["paper"] and eagle.choice.record.path == record
    assert draft.name == "draft" and eagle.describe().startswith("acc(n) = ")
    given = report_acceptance("eagle", str(checkpoint))  # an EAGLE setting wins over the shipped one
    medusa, eagle, _ = report_drafters(given, str(checkpoint))
    assert medusa.choice is ACCEPTANCE_PRESETS["paper"] and eagle.choice is ACCEPTANCE_PRESETS["eagle"]
    assert report_drafters(paper, "llama-7b")[1].choice is ACCEPTANCE_PRESETS["eagle"]  # not a folder: the preset
