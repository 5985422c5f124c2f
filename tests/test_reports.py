"""python -m reports: self-contained pages with every figure visible, strings escaped,
predicted and measured labelled, and the numbers a person acts on."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from browser import loaded_images, screenshot
from PIL import Image

from reports.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "decoder" / "assets" / "bundled"
MAX_BYTES = 5_000_000


@pytest.fixture(scope="module")
def a100(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("a100")
    assert main(["build", "--gpu", "a100", "--model", "llama-7b", "--out", str(out)]) == 0
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
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert all(h.startswith("#") for h in attributes(html, "href")), "only in-page links"
    assert "<script" not in html and "<link" not in html and "@import" not in html and "url(" not in html
    return html


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
    sections = headings(html)
    for wanted in (
        "At a glance",
        "Device",
        "Ceilings and latency model",
        "Speedup",
        "Acceptance",
        "Recommended tree",
        "Capacity planning",
        "Prediction error",
    ):
        assert any(h.startswith(wanted) for h in sections), f"no section {wanted!r} in {sections}"
    # the spec's sources and the predicted-only verdicts a serving team acts on
    assert "nvidia-a100-datasheet" in html and "No measured data for this device and model" in html
    assert "do not speculate from batch 16 on (predicted)" in html
    assert html.count('class="tag predicted"') >= 11 and 'class="tag measured"' not in html
    # the paper preset has no head accuracies: the Vicuna-7B tree's own first nodes, cut at its 64 tokens
    assert "optimum is 160 tokens, beyond the 64 tokens of that tree" in html


def test_variation_tables_give_tflops_and_intensity_per_candidates(a100):
    html = (a100 / "report.html").read_text(encoding="utf-8")
    assert html.count("Tables 6-8 style") == 3
    header = re.search(r"<th[^>]*>op</th><th[^>]*>batch</th><th[^>]*>seq_len</th>((?:<th[^>]*>q=\d+</th>)+)", html)
    assert header and re.findall(r"q=(\d+)", header.group(1)) == ["1", "16", "32", "48", "64", "80", "96", "112"]
    # a cell is "TFLOP/s (intensity)": QK^T at s=1024, q=64 has the paper's 40.96 FLOP/byte
    q64 = re.findall(r"q=(\d+)", header.group(1)).index("64")
    rows = re.findall(
        r'<tr><td class="text">qk</td><td class="num">16</td><td class="num">1024</td>((?:<td[^>]*>[^<]*</td>)+)</tr>',
        html,
    )
    assert rows, "no QK^T row at batch 16, seq_len 1024"
    for cells in rows:
        cell = re.findall(r"<td[^>]*>([^<]*)</td>", cells)[q64]
        assert re.fullmatch(r"[\d.]+ \(41\)", cell), cell


def test_figures_are_drawn_not_blank(a100):
    for png in a100.glob("*.png"):
        pixels = np.asarray(Image.open(png).convert("L"), dtype=float)
        assert pixels.shape[1] >= 800, f"{png.name} too small to read"
        assert (pixels < 200).mean() > 0.01, f"{png.name} is nearly blank"


def test_measured_inputs_are_shown_and_compared(bundled_cpu):
    html = check_self_contained(bundled_cpu / "report.html")
    assert (bundled_cpu / "closed-loop.png").exists()
    assert html.count('class="tag measured"') >= 2
    # acceptance record: heat map and histogram, with the fits' errors against it
    assert "measured: head top-k accuracy" in html and "head_accuracy_error" in html
    # the shipped closed loop: predicted vs measured speedup with its error, as a percentage
    assert "Speedup (closed loop, perfmodel.validate)" in html
    assert re.search(r"<td[^>]*>[+-]\d+\.\d%</td>", html)
    # the shipped sweep is of llama-7b: said, not silently used for the bundled model
    assert "none of bundled, so its operators are predicted only" in html
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
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Operators: predicted time (roofline latency model) vs measured time" in html
    assert "median_abs_error" in html and html.count('class="tag measured"') >= 4


def test_every_string_is_escaped(tmp_path):
    spec = yaml.safe_load((ROOT / "hw_specs" / "a40.yaml").read_text())
    spec["name"] = "<script>alert('x')</script> & co"
    spec.pop("aliases", None)
    path = tmp_path / "evil.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["build", "--spec", str(path), "--model", "llama-7b", "--out", str(tmp_path / "r"), "--jobs", "1"]) == 0
    html = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    assert "<script>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in html


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
    assert "not a perfmodel.validate --csv file" in capsys.readouterr().err


def test_compare_puts_devices_side_by_side(tmp_path, capsys):
    assert (
        main(["compare", "--gpu", "a100", "a40", "rtx-a6000", "h100", "--model", "llama-7b", "--out", str(tmp_path)])
        == 0
    )
    html = check_self_contained(tmp_path / "compare.html")
    assert len(list(tmp_path.glob("*.png"))) == len(attributes(html, "src")) == 4
    assert headings(html)[:4] == ["Ceilings", "Decode latency", "Best tree and speedup per batch", "Capacity planning"]
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


def test_compare_skips_devices_without_the_dtype(tmp_path, capsys):
    assert (
        main(["compare", "--gpu", "a100", "h100", "--model", "llama-7b", "--dtype", "fp8", "--out", str(tmp_path)]) == 0
    )
    html = (tmp_path / "compare.html").read_text(encoding="utf-8")
    assert "Skipped: a100-pcie (no fp8 peak in its spec)" in html


def test_report_renders_in_a_real_browser(a100, bundled_cpu, tmp_path):
    for folder in (a100, bundled_cpu):
        page = folder / "report.html"
        images = loaded_images(page)
        assert len(images) == len(list(folder.glob("*.png")))
        broken = [i["alt"][:60] for i in images if not (i["complete"] and i["natural"] > 0)]
        assert not broken, f"broken images: {broken}"
        small = [i["alt"][:60] for i in images if i["shown"] < 500]
        assert not small, f"figures shown too small to read: {small}"
        shot = np.asarray(Image.open(screenshot(page, tmp_path / f"{folder.name}.png")).convert("L"), dtype=float)
        # the top of the page: title, contents, device table, text; not a blank window
        assert (shot < 128).mean() > 0.02 and shot.std() > 20


def test_recommended_tree_comes_from_head_accuracies_when_measured():
    from perfmodel.trees import greedy_tree, vicuna_7b_prefix
    from reports.sources import recommended_tree, report_acceptance

    measured = report_acceptance(None, str(BUNDLED))  # the checkpoint's own record
    tree = recommended_tree(11, measured)
    assert tree.tree == greedy_tree(measured.record["head_topk_accuracy"], 10) and tree.accuracy is not None
    paper = report_acceptance("paper", str(BUNDLED))
    assert recommended_tree(16, paper).tree == vicuna_7b_prefix(15)
    capped = recommended_tree(160, paper)
    assert capped.tree.size == 64 and "optimum is 160 tokens" in capped.note
    assert recommended_tree(1, paper) is None
