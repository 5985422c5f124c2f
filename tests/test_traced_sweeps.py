"""The traced step as a flavour of the sweeps, the capacity plan and the report: --step traced
on perfmodel.speedup (the simulations), perfmodel.plan and reports build, priced from the
decoder's traces (decoder.trace.StepTracer) without the analytic core importing the decoder."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import decoder.trace
from decoder.trace import StepTracer
from perfmodel.acceptance.rates import resolve_acceptance
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.planning import simulations
from perfmodel.planning.capacity import plan
from perfmodel.planning.simulations import Simulation
from perfmodel.planning.step_models import flavor_steps
from reports.__main__ import main as reports_main
from reports.commands import speedup
from reports.commands.plan import main as plan_main
from tests.conftest import deploy
from tests.helpers import one_line_error

BUNDLED = load_model("bundled")  # 4 layers, 4096-token context: quick to trace and price
LLAMA_7B = load_model("llama-7b")
# The three simulations on a few points each (simulation (c) past the bundled model's context).
SMALL = (
    Simulation("a", "b1-s1024", (1,), (1024,), "b=1, s=1024"),
    Simulation("b", "s1024-by-batch", (1, 2), (1024,), "s=1024, batch 1..2", "batch"),
    Simulation("c", "b4-by-seq", (4,), (128, 8192), "b=4, s=128..8192", "seq_len"),
)
SIZES = (1, 2, 4, 8, 16)


@pytest.fixture(scope="module")
def a100():
    return resolve_devices("a100")[0]


@pytest.fixture
def traced_points(monkeypatch):
    """The (batch, context, tree size) points decoder.trace records, in order."""
    points, record = [], decoder.trace.record_step
    monkeypatch.setattr(decoder.trace, "record_step", lambda *a, **k: points.append(a[1:4]) or record(*a, **k))
    return points


def small_grid(monkeypatch, module) -> None:
    """`module`'s device_table over SMALL and SIZES (the full grid traces ~800 points): each
    simulation asked for (all three, or one, as the report's drafters ask for (b)) over SMALL's
    points of it."""
    real = simulations.device_table

    def small(*args, simulations=simulations.SIMULATIONS, sizes=None):
        asked = {simulation.key for simulation in simulations}
        return real(*args, simulations=tuple(s for s in SMALL if s.key in asked), sizes=SIZES)

    monkeypatch.setattr(module, "device_table", small)


def test_step_flavors_come_in_the_order_asked_and_the_traced_one_needs_a_tracer(a100):
    steps = flavor_steps(a100, BUNDLED, "fp16", 1, "auto", ("traced", "paper"), StepTracer())
    assert list(steps) == ["traced", "paper"]
    assert isinstance(steps["traced"].shard_step, TracedStep) and steps["paper"].shard_step.flavor == "paper"
    assert steps["traced"].label == steps["paper"].label  # one latency source for every flavour
    one_line_error(lambda: flavor_steps(a100, BUNDLED, "fp16", flavors=("traced",)), "needs a tracer", "StepTracer")
    one_line_error(lambda: flavor_steps(a100, BUNDLED, "fp16", flavors=("fast",)), "'fast'", "paper, full, traced")


def test_a_traced_shard_pays_the_all_reduces_of_every_layer():
    h100 = resolve_devices("h100")[0]
    model = load_model("llama-2-70b")
    steps = flavor_steps(h100, model, "fp16", 4, "auto", ("full", "traced"), StepTracer())
    traced, full = steps["traced"], steps["full"]
    assert traced.shard_step.model == model.shard(4)  # the shard is traced, not the model
    comm = traced.step_time(2, 512, 8) - traced.shard_step.step_time(2, 512, 8)
    np.testing.assert_allclose(comm, full.comm_time(2, 8) + full.gather_time(2, 8, True), rtol=1e-12)
    assert comm > 0


def test_the_simulations_price_the_traced_step_from_its_traces(a100, traced_points):
    acceptance = resolve_acceptance(None)
    deployment = deploy(a100, BUNDLED, "fp16", tracer=StepTracer(beyond_context=True))
    table = simulations.device_table(deployment, ("full", "traced"), acceptance, SMALL, SIZES)
    assert list(dict.fromkeys(table["step"])) == ["full", "traced"]
    traced = table[table["step"] == "traced"]
    assert len(traced) == len(table) / 2 and traced["best"].sum() == 1 + 2 + 2  # one optimum per curve
    # every (batch, context, tree size) of the grid traced once, plain steps included
    grid = {(b, s, n) for sim in SMALL for b in sim.batches for s in sim.seqs for n in SIZES}
    assert sorted(traced_points) == sorted(grid)
    # a row's step times are its traces' priced kernels, summed
    step = TracedStep(BUNDLED, flavor_steps(a100, BUNDLED, "fp16").get("full").shard_step.latency, "fp16", StepTracer())
    row = traced[(traced["batch"] == 2) & (traced["tree_size"] == 8)].iloc[0]
    assert row["medusa_step_s"] == pytest.approx(step.priced(2, 1024, 8)["time_s"].sum(), rel=1e-12)
    assert row["plain_step_s"] == pytest.approx(step.priced(2, 1024, 1)["time_s"].sum(), rel=1e-12)
    # past the model's 4096-token context: priced, and marked as the other steps' rows are
    beyond = traced[traced["seq_len"] == 8192]
    assert beyond["beyond_context"].all() and (beyond["medusa_step_s"] > 0).all()


def test_speedup_sweeps_the_traced_step_and_shares_its_traces(tmp_path, capsys, monkeypatch, traced_points):
    small_grid(monkeypatch, speedup)
    csv = tmp_path / "all.csv"
    argv = ["--gpu", "a100", "--model", "bundled", "--step", "all", "--out", str(tmp_path), "--csv", str(csv)]
    assert speedup.main([*argv, "--jobs", "1"]) == 0
    table = pd.read_csv(csv)
    assert list(dict.fromkeys(table["step"])) == ["paper", "full", "traced"]
    assert (table["beyond_context"] == (table["seq_len"] > BUNDLED.max_context)).all()
    shown = capsys.readouterr().out
    assert "traced step: tree of" in shown and "Medusa at b=1, s=1024: paper step" in shown
    assert "datasheet" in shown  # a100-pcie's latency is borrowed: its optima are compared with the datasheet's
    # the borrowed table and the datasheet comparison, both priced from one trace per point
    assert len(traced_points) == len(set(traced_points)) == 4 * len(SIZES)


def test_the_plan_times_its_configurations_by_the_traced_step(a100):
    tracer = StepTracer(beyond_context=True)
    kwargs = dict(batches=[1, 8], sizes=(1, 4, 16), latency="auto")
    traced = plan(BUNDLED, [a100], step="traced", tracer=tracer, **kwargs)
    full = plan(BUNDLED, [a100], **kwargs)
    assert traced.devices["latency_model"].iloc[0] == "traced step: " + full.devices["latency_model"].iloc[0]
    step = flavor_steps(a100, BUNDLED, "fp16", 1, "auto", ("traced",), tracer)["traced"]
    configs = traced.configs
    expected = step.step_time(configs["batch"], traced.workload.step_context, configs["tree_size"])
    np.testing.assert_allclose(configs["medusa_step_s"], expected, rtol=1e-12)
    assert not np.allclose(configs["medusa_step_s"], full.configs["medusa_step_s"])  # not the full step's
    one_line_error(lambda: plan(BUNDLED, [a100], step="traced", **kwargs), "needs a tracer")
    one_line_error(lambda: plan(BUNDLED, [a100], step="paper", **kwargs), "'paper'", "full, traced")


def test_the_plan_command_takes_the_traced_step(capsys):
    assert plan_main(["--model", "bundled", "--gpu", "a100", "--step", "traced", "--batch", "1", "2"]) == 0
    shown = capsys.readouterr().out
    assert "traced step: " in shown and "Bands on a100-pcie" in shown


def test_the_plan_prices_the_traced_step_in_a_launch_regime_and_names_it(a100, capsys):
    kwargs = dict(batches=[1, 8], sizes=(1, 16), latency="auto")
    graph = plan(
        BUNDLED, [a100], step="traced", tracer=StepTracer(beyond_context=True, launch="graph"), launch="graph", **kwargs
    )
    eager = plan(
        BUNDLED, [a100], step="traced", tracer=StepTracer(beyond_context=True, launch="eager"), launch="eager", **kwargs
    )
    label = graph.devices["latency_model"].iloc[0]
    assert label.startswith("traced step (graph: the static step replayed from a CUDA graph")
    assert eager.devices["latency_model"].iloc[0].startswith("traced step (eager: the reference decoder's loop")
    steps = flavor_steps(
        a100, BUNDLED, "fp16", 1, "auto", ("traced",), StepTracer(beyond_context=True, launch="graph"), "graph"
    )
    configs = graph.configs
    expected = steps["traced"].step_time(configs["batch"], graph.workload.step_context, configs["tree_size"])
    np.testing.assert_allclose(configs["medusa_step_s"], expected, rtol=1e-12)
    # a step with no launches of its own to price, or a regime nobody knows: one line each
    one_line_error(lambda: plan(BUNDLED, [a100], launch="graph", **kwargs), "--launch graph", "--step traced")
    one_line_error(lambda: plan(BUNDLED, [a100], step="traced", tracer=StepTracer(), launch="jit", **kwargs), "'jit'")
    with pytest.raises(SystemExit):
        plan_main(["--model", "bundled", "--gpu", "a100", "--launch", "graph"])
    assert "--launch graph prices the traced step's launches: use --step traced" in capsys.readouterr().err


def test_a_report_priced_by_the_traced_step_recommends_from_it(tmp_path, monkeypatch, capsys):
    small_grid(monkeypatch, simulations)
    # 4.8 GB of KV cache per 9,216-token sequence: one fits on an RTX 4090, a plan of one batch to trace
    argv = ["build", "--gpu", "rtx-4090", "--model", "llama-7b", "--step", "traced", "--latency", "datasheet"]
    argv += ["--prompt-len", "8192", "--response-len", "1024", "--out", str(tmp_path), "--jobs", "1"]
    assert reports_main(argv) == 0
    facts = capsys.readouterr().out
    assert "traced step (decoder's kernels): tree of" in facts and "full step (whole model): tree of" in facts
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Traced step: every kernel the reference decoder" in page
    assert "context 1024, traced step (the reference decoder" in page  # the best tree per batch is the traced one
    assert "Step latency: traced step: roofline latency" in page  # the capacity plan's
