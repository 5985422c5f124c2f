"""Issue #22, items 2, 5 (sizes), 7, 8 and 9: the capacity plan and the speedups of one
deployment agree, advise only what they accept, and search every batch that fits."""

import json
import re
from html import escape as html_escape
from pathlib import Path

import pandas as pd
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.latency.source import view_latency
from perfmodel.latency.step import StepModel
from perfmodel.latency.tensor_parallel import tensor_parallel_steps
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import load_model
from perfmodel.planning import simulations
from perfmodel.planning.capacity import plan
from reports.__main__ import main as reports_main
from reports.build import capacity_plan
from reports.commands.speedup import main as speedup_main
from reports.report import BuildConfig
from reports.sources import report_acceptance
from tests.conftest import deploy

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "decoder" / "assets" / "bundled"
PROFILE = ROOT / "profilers" / "measurements" / "h100-sxm" / "imported" / "vidur-Llama-2-7b-hf.csv"


# --------------------------------------------------------------------------- item 2


@pytest.fixture(scope="module")
def given_h100_rows(tmp_path_factory) -> Path:
    """A sweep of the h100's linear layers three times slower than its shipped profile:
    numbers no stored source gives, so only a plan that reads them can match them."""
    rows = pd.read_csv(PROFILE)
    rows = rows[rows["op"].isin(["qkv", "o", "gate_up", "down"])].assign(time_s=lambda d: d["time_s"] * 3)
    path = tmp_path_factory.mktemp("given") / "h100-given.csv"
    rows.to_csv(path, index=False)
    return path


def test_the_report_plan_prices_with_the_given_measurements_as_the_speedups_do(given_h100_rows, tmp_path):
    view = resolve_view("h100", None, [given_h100_rows])
    model = load_model("llama-7b")
    acceptance = report_acceptance("paper", "llama-7b")
    sims = simulations.device_table(deploy(view, model, "fp16"), ("full",), acceptance.choice)
    planned = capacity_plan(model, view, "fp16", acceptance, BuildConfig(model="llama-7b", out=tmp_path))
    label = sims["latency_model"].iloc[0]
    assert "given measurements" in label
    assert planned.devices["latency_model"].iloc[0] == label
    # and the numbers: the plan's plain step is the speedup sections' step at the plan's context
    context = planned.workload.step_context
    plain = planned.configs[(planned.configs["batch"] == 1) & (planned.configs["tree_size"] == 1)]
    expected = StepModel(model, view_latency(view, model, "fp16")).step_time(1, context, 1)
    assert plain["medusa_step_s"].iloc[0] == pytest.approx(float(expected))


def test_a_cpu_report_plan_uses_the_cpu_view_as_the_speedups_do(tmp_path):
    view = resolve_view("cpu-intel-xeon-processor-2c", None, [])
    model = load_model(BUNDLED)
    acceptance = report_acceptance("paper", str(BUNDLED))
    sims = simulations.device_table(deploy(view, model, "fp32"), ("full",), acceptance.choice)
    config = BuildConfig(model=str(BUNDLED), out=tmp_path)
    planned = capacity_plan(model, view, "fp32", acceptance, config)
    assert planned.devices["latency_model"].iloc[0] == sims["latency_model"].iloc[0]


# --------------------------------------------------------------------------- item 7


def huge_model(tmp_path: Path) -> Path:
    """Llama-3.1-405B's shapes: 831 GB of fp16 weights and heads, more than 8 of any device."""
    config = {
        "model_type": "llama",
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "num_hidden_layers": 126,
        "vocab_size": 128256,
    }
    folder = tmp_path / "llama-405b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def advice(message: str, device: str) -> str:
    part = message.split(f"{device}: ", 1)[1]
    return re.split(r"; [a-z0-9-]+: (?:weights|one )", part)[0]


@pytest.mark.parametrize(
    "model, devices, dtype",
    [
        ("llama-2-70b", ["rtx-4090"], "fp32"),  # 13 devices' worth of memory; 64 heads
        ("llama-2-70b", ["rtx-4090"], "fp16"),
        ("huge", ["h100", "rtx-4090", "a100"], "fp16"),
    ],
)
def test_advised_degrees_are_ones_the_planner_then_accepts(model, devices, dtype, tmp_path):
    model = huge_model(tmp_path) if model == "huge" else model
    with pytest.raises(PerfkitError, match="fits on none of the devices") as caught:
        plan(model, devices, dtype=dtype)
    message = str(caught.value)
    keys = [resolve_view(d, None, []).spec.key for d in devices]
    for key in keys:
        said = advice(message, key)
        found = re.search(r"--tp (\d+)", said)
        if found is None:
            assert "no tensor-parallel degree holds it" in said, said
            continue
        tp = int(found.group(1))
        assert tp in load_model(model).tensor_parallel_degrees(512), said
        row = plan(model, key, dtype=dtype, tensor_parallel=tp, batches=[1], sizes=[1]).devices.iloc[0]
        assert row["fits"] and row["tensor_parallel"] == tp


def test_a_model_that_no_usable_degree_holds_is_told_so(tmp_path):
    # h100-sxm's all-reduces are measured over 2, 4 and 8 GPUs only: 8 x 72 GB < 831 GB
    with pytest.raises(
        PerfkitError, match=r"h100-sxm: .*no tensor-parallel degree holds it: h100-sxm can use 1, 2, 4, 8"
    ):
        plan(huge_model(tmp_path), "h100")


# --------------------------------------------------------------------------- item 8


@pytest.mark.parametrize("tp", [4, 8])
def test_the_recommended_batch_is_searched_up_to_the_max_batch(tp):
    result = plan("llama-2-70b", "h100", tensor_parallel=tp)
    row = result.devices.iloc[0]
    bands = result.bands
    assert row["max_batch"] > 256 and bands["batch"].max() == row["max_batch"]
    assert bands["batch"].is_unique and (bands["batch"] <= row["max_batch"]).all()
    # the recommendation is the best of every batch searched, and beats batch 256's
    assert row["total_tokens_s"] == pytest.approx(bands["total_tokens_s"].max())
    assert row["batch"] > 256 and row["total_tokens_s"] > bands.set_index("batch").loc[256, "total_tokens_s"]


def test_the_plan_command_recommends_beyond_batch_256(capsys):
    from reports.commands.plan import main

    assert main(["--model", "llama-2-70b", "--gpu", "h100", "--tp", "8"]) == 0
    out = capsys.readouterr().out
    batch = int(re.search(r"Recommended: batch ([\d,]+)", out).group(1).replace(",", ""))
    assert batch > 256


def test_the_readme_quotes_the_recommendations_the_plan_makes():
    readme = " ".join((ROOT / "docs" / "planning.md").read_text().split())  # the planning guide keeps the sentence
    found = re.search(
        r"llama-2-70b on four H100s recommends batch ([\d,]+) \(([\d,]+) tokens/s; its max batch ([\d,]+) .*?"
        r"on eight batch ([\d,]+)",
        readme,
    )
    assert found, "docs/planning.md's sentence on llama-2-70b's recommended batches"
    four_batch, four_rate, four_max, eight_batch = (int(g.replace(",", "")) for g in found.groups())
    four = plan("llama-2-70b", "h100", tensor_parallel=4).devices.iloc[0]
    eight = plan("llama-2-70b", "h100", tensor_parallel=8).devices.iloc[0]
    assert (four["batch"], round(four["total_tokens_s"]), four["max_batch"]) == (four_batch, four_rate, four_max)
    assert eight["batch"] == eight_batch


# --------------------------------------------------------------------------- item 5 (sizes)


def test_a_small_model_plan_says_megabytes_not_zero_gigabytes():
    summary = plan(BUNDLED, "cpu-intel-xeon-processor-2c", dtype="fp32").summary()
    assert "0.0 GB" not in summary
    assert re.search(r"\d+(\.\d+)? MB of weights \+ \d+(\.\d+)? MB of Medusa heads", summary), summary


# --------------------------------------------------------------------------- item 9


def test_speedup_refuses_a_model_that_does_not_fit_one_device_and_names_the_degree(tmp_path, capsys):
    args = ["--gpu", "h100", "--model", "llama-2-70b", "--step", "full", "--out", str(tmp_path / "s")]
    assert run(speedup_main, args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: llama-2-70b") and "--tp 2" in err and len(err.strip().splitlines()) == 1


def test_speedup_says_so_where_no_degree_holds_the_model(tmp_path, capsys):
    # llama-13b in fp32 (52 GB) on the stored 25 GB two-core CPU, whose all-reduce is measured over 2 ranks only
    args = ["--gpu", "cpu-intel-xeon-processor-2c", "--model", "llama-13b", "--step", "full"]
    assert run(speedup_main, [*args, "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "note: llama-13b in fp32 fits on none of the devices" in out and "no tensor-parallel degree holds it" in out


def test_speedup_with_tp_prices_the_sharded_model_and_its_all_reduces_as_the_plan_does(tmp_path, capsys):
    out = tmp_path / "s"
    args = ["--gpu", "h100", "--model", "llama-2-70b", "--step", "full", "--tp", "2", "--out", str(out)]
    assert run(speedup_main, args) == 0
    table = pd.read_csv(out / "speedup.csv")
    assert table["latency_model"].str.contains("tp=2: 2 all-reduces per layer").all()
    # the plan at the same degree and context (896 prompt tokens + half of 256 = 1024) prices the same steps
    planned = plan("llama-2-70b", "h100", tensor_parallel=2, prompt_len=896, response_len=256, batches=[1])
    assert planned.workload.step_context == 1024
    configs = planned.configs.set_index(["batch", "tree_size"])
    for size in (1, 16, 64):
        row = table[(table["simulation"] == "a") & (table["tree_size"] == size)].iloc[0]
        assert row["medusa_step_s"] == pytest.approx(configs.loc[(1, size), "medusa_step_s"])
    assert planned.devices["latency_model"].iloc[0] == table["latency_model"].iloc[0]


def test_speedup_tp_auto_takes_the_plans_choice_and_says_so(tmp_path, capsys):
    args = ["--gpu", "h100", "--model", "llama-2-70b", "--step", "full", "--tp", "auto", "--out", str(tmp_path / "s")]
    assert run(speedup_main, args) == 0
    chosen = plan("llama-2-70b", "h100", tensor_parallel=None).devices["tensor_parallel"].iloc[0]
    assert chosen > 1
    out = capsys.readouterr().out
    assert f"--tp auto chose {chosen}" in out and f"tp={chosen}: 2 all-reduces per layer" in out


def test_speedup_tp_rejects_a_degree_that_does_not_split_the_model(tmp_path, capsys):
    args = ["--gpu", "h100", "--model", "llama-2-70b", "--tp", "3", "--out", str(tmp_path / "s")]
    assert run(speedup_main, args) == 1
    assert "tensor parallel 3 cannot be served on h100-sxm (it does not split llama-2-70b" in capsys.readouterr().err


def test_the_paper_step_pays_for_one_layers_all_reduces():
    view = resolve_view("h100", None, [])
    model = load_model("llama-2-70b")
    acceptance = report_acceptance("paper", "llama-2-70b").choice
    one, two = (simulations.device_table(deploy(view, model, "fp16", tp=tp), ("paper",), acceptance) for tp in (1, 2))
    plain = lambda t: t[(t["simulation"] == "a") & (t["tree_size"] == 1)]["plain_step_s"].iloc[0]  # noqa: E731
    # the paper's block is one layer: halving it adds its 2 all-reduces (tens of us), not the
    # whole model's 160, which would cost more than the layer's own 0.3 ms
    assert plain(two) < plain(one)


def test_reports_build_refuses_a_model_that_needs_tensor_parallel_before_any_work(tmp_path, capsys):
    out = tmp_path / "r"
    assert run(reports_main, ["build", "--gpu", "h100", "--model", "llama-2-70b", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "--tp 2" in err and len(err.strip().splitlines()) == 1
    assert not (out / "report.html").exists()


def test_reports_build_with_tp_prices_every_section_at_that_degree(tmp_path, capsys):
    out = tmp_path / "r"
    args = ["build", "--gpu", "a100", "--model", "llama-7b", "--tp", "2", "--latency", "datasheet"]
    assert run(reports_main, [*args, "--out", str(out), "--jobs", "1"]) == 0
    html = (out / "report.html").read_text()
    assert "x2 (tensor parallel)" in html and "Capacity on 2 devices in tensor parallel: max batch" in html
    assert "tp=2: 2 all-reduces per layer" in html
    assert "--tp 2" not in html  # the capacity section no longer advises an option the command lacks
    # the plain-step sentence prices the same sharded step, all-reduces included, as the speedups do
    view = resolve_view("a100", None, [])
    step = tensor_parallel_steps(view, load_model("llama-7b"), "fp16", 2, "datasheet")["full"]
    sentence = f"context 1024: {float(step.step_time(1, 1024, 1)) * 1e3:.2f} ms (latency: {step.label})"
    assert html_escape(sentence) in html
