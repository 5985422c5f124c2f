"""The traced step's per-kernel launch costs: the spec fields kernel_launch_us and
graph_node_us (hw_specs/README.md), eager and CUDA-graph pricing (perfmodel.latency.traced),
and the CPU's measured per-op overhead."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from hw_specs import SPEC_DIR
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import find_spec, load_all_specs, load_spec_file
from perfmodel.latency.kinds import MEMORY_KINDS
from perfmodel.latency.pipeline import HOST_KINDS, HostCosts
from perfmodel.latency.source import latency_source, view_latency
from perfmodel.latency.traced import CAPTURED_PARTS, TRACE_COLUMNS, launch_costs, price_trace
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import load_model
from reports.commands.speedup import main as speedup
from tests.helpers import custom_spec, one_line_error

LLAMA = load_model("llama-7b")


def trace(*kernels: dict) -> pd.DataFrame:
    """A trace table of the kernels given (every other column 0; part forward unless given)."""
    blank = dict.fromkeys(TRACE_COLUMNS, 0) | {"step": "plain", "part": "forward", "dtype": "fp16", "shapes": ""}
    return pd.DataFrame([blank | {"index": i} | k for i, k in enumerate(kernels)])


# A step in miniature: memory-bound kernels in the forward (captured by a graph) and in the
# verification and commit (not), and the host syncs between them.
STEP = trace(
    *({"kind": "elementwise", "bytes": 4e5} for _ in range(30)),
    *({"kind": "copy", "bytes": 1e6} for _ in range(10)),
    {"kind": "reduction", "bytes": 2e4, "part": "verification"},
    {"kind": "host_sync", "part": "verification"},
    {"kind": "indexing", "bytes": 1e4, "part": "kv_update"},
    {"kind": "host_sync", "part": "kv_update"},
)


def test_every_shipped_spec_prices_a_launch_and_a_graph_node_with_sources():
    specs = load_all_specs()
    assert len(specs) == len(list(SPEC_DIR.glob("*.yaml")))
    for spec in specs.values():
        assert 1 <= spec.graph_node_us < spec.kernel_launch_us <= 10, spec.key
        for field in ("kernel_launch_us", "graph_node_us"):
            assert "http" in spec.source_of(field), f"{spec.key}: {field} has no URL"
    # the measured devices: their grids' per-kernel floor under graph replay (transfer.kernel_floor)
    measured = {k: find_spec(k).graph_node_us for k in ("a100-sxm", "h100-sxm", "h200", "l40s")}
    assert measured == {"a100-sxm": 4.17, "h100-sxm": 2.95, "h200": 2.96, "l40s": 2.67}
    for key in measured:
        assert "kernel_floor" in find_spec(key).source_of("graph_node_us")
        assert find_spec(key).kernel_launch_us == pytest.approx(measured[key] + 0.4)


@pytest.mark.parametrize(
    "changes, fragments",
    [
        ({"kernel_launch_us": "fast"}, ("'kernel_launch_us' must be a number", "'fast'")),
        ({"kernel_launch_us": -3}, ("'kernel_launch_us' must be positive",)),
        ({"kernel_launch_us": 3.5e-6}, ("'kernel_launch_us' is 3.5e-06", "microseconds per kernel")),
        ({"graph_node_us": 5000}, ("'graph_node_us' is 5000", "microseconds per kernel")),
        ({"graph_node_us": 4.0, "kernel_launch_us": 3.0}, ("'graph_node_us' (4) exceeds 'kernel_launch_us' (3)",)),
        ({"kernel_launch_us": None}, ("'graph_node_us' needs 'kernel_launch_us'",)),
    ],
)
def test_a_bad_launch_cost_is_a_one_line_error(tmp_path, changes, fragments):
    one_line_error(lambda: load_spec_file(custom_spec(tmp_path, **changes)), "my_gpu.yaml", *fragments)


def test_a_launch_cost_needs_a_source(tmp_path):
    sources = find_spec("a40").sources | {}
    del sources["graph_node_us"]
    one_line_error(lambda: load_spec_file(custom_spec(tmp_path, sources=sources)), "'graph_node_us' has no entry")


def test_a_spec_without_launch_costs_prices_the_sources_overhead_and_no_graph(tmp_path):
    spec = load_spec_file(custom_spec(tmp_path, kernel_launch_us=None, graph_node_us=None))
    assert spec.kernel_launch_us is None and spec.graph_node_us is None
    latency = latency_source(spec, LLAMA, "fp16", "datasheet")
    priced = price_trace(trace({"kind": "copy", "bytes": 0}), latency, "fp16")
    assert priced["time_s"].iloc[0] == pytest.approx(RooflineParams().kernel_overhead_s)
    one_line_error(lambda: price_trace(STEP, latency, "fp16", cuda_graph=True), "My Accelerator", "graph_node_us")


def test_a_gpu_pays_its_specs_launch_cost_eager_not_the_sources_fitted_overhead():
    latency = latency_source("a100-sxm", LLAMA, "fp16")  # measured: a fitted per-kernel overhead of ~8.5 us
    spec, params = latency.spec, latency.params
    assert params.kernel_overhead_s > 1.5 * spec.kernel_launch_us * 1e-6
    priced = price_trace(STEP, latency, "fp16")
    moved = STEP["bytes"].to_numpy() / (spec.bandwidth * params.memory_efficiency)
    launch = spec.kernel_launch_us * 1e-6
    assert priced["time_s"].to_numpy() == pytest.approx(moved + launch)  # a host sync: one launch, no bytes
    assert set(priced.loc[priced["kind"] != "host_sync", "source"]) == {"bytes / bandwidth + launch"}


def test_a_cuda_graph_saves_launch_minus_node_on_each_captured_kernel_only():
    latency = latency_source("h100-sxm", LLAMA, "fp16")
    eager, graph = (price_trace(STEP, latency, "fp16", cuda_graph=g) for g in (False, True))
    cost = launch_costs(latency)  # the H100's node: its GPU check's replays (perfmodel.latency.graph_node)
    saved = (eager["time_s"] - graph["time_s"]).to_numpy()
    captured = (STEP["part"].isin(CAPTURED_PARTS) & (STEP["kind"] != "host_sync")).to_numpy()
    assert captured.sum() == 40
    assert saved[captured] == pytest.approx(cost.eager_s - cost.graph_s)
    assert saved[~captured] == pytest.approx(0.0)  # verification, commit and host syncs stay eager
    assert set(graph.loc[captured, "source"]) == {"bytes / bandwidth + graph node"}


def test_a_traced_step_in_graph_mode_is_faster_by_kernels_times_launch_minus_node():
    latency = latency_source("l40s", LLAMA, "fp16")
    tracer = lambda model, batch, context, candidates, dtype: STEP  # noqa: E731
    eager, graph = (TracedStep(LLAMA, latency, "fp16", tracer, cuda_graph=g) for g in (False, True))
    spec = latency.spec
    saved = float(eager.step_time(1, 512) - graph.step_time(1, 512))
    assert saved == pytest.approx(40 * (spec.kernel_launch_us - spec.graph_node_us) * 1e-6)
    assert eager.launch_label == "eager, 3.07 us per kernel launch (l40s spec: kernel_launch_us)"
    assert "2.67 us per captured kernel" in graph.launch_label and "eager at 3.07 us" in graph.launch_label


def test_a_cpu_keeps_its_measured_per_op_overhead_and_runs_no_graph():
    view = resolve_view("cpu-amd-epyc-2c", None, [], log=lambda _: None)
    latency = view_latency(view, LLAMA, "fp32")
    measured = view.params.kernel_overhead_s
    assert view.spec.kernel_launch_us is None and measured is not None
    cost = launch_costs(latency)
    assert (cost.eager_s, cost.graph_s, cost.from_spec) == (measured, None, False)
    priced = price_trace(trace({"kind": "host_sync"}, {"kind": "copy", "bytes": 0}), latency, "fp32")
    assert priced["time_s"].tolist() == pytest.approx([measured, measured])
    one_line_error(
        lambda: TracedStep(LLAMA, latency, "fp32", lambda *a: STEP, cuda_graph=True), "a CPU runs no CUDA graphs"
    )


def test_a_source_whose_spec_knows_only_its_bandwidth_prices_its_own_overhead():
    """The closed-loop twin hands price_trace a machine's measured bandwidth and overhead."""
    params = RooflineParams(memory_efficiency=1.0, kernel_overhead_s=7e-6)
    source = SimpleNamespace(spec=SimpleNamespace(name="this machine", bandwidth=1e10), params=params)
    priced = price_trace(trace({"kind": "elementwise", "bytes": 1e4}), source, "fp32")
    assert priced["time_s"].iloc[0] == pytest.approx(1e4 / 1e10 + 7e-6)


def test_the_point_answer_says_how_the_traced_step_launched(tmp_path, capsys):
    from decoder.trace import trace_step  # torch: the decoder's own tracer

    point = ["--gpu", "a100", "--model", "llama-7b", "--step", "all", "--tree-size", "64", "--acceleration", "3"]
    tables = {}
    for mode, extra in (("eager", []), ("cuda graph", ["--cuda-graph"])):
        csv = tmp_path / f"{mode}.csv"
        assert speedup([*point, *extra, "--csv", str(csv)]) == 0
        tables[mode] = pd.read_csv(csv).set_index("step")
    out = capsys.readouterr().out
    assert "launch: eager, 4.55 us per kernel launch (a100-pcie spec: kernel_launch_us)" in out
    assert "launch: CUDA graph over the forward part, 4.15 us per captured kernel" in out
    eager, graph = tables["eager"], tables["cuda graph"]
    assert graph.loc["traced", "launch"] == "cuda graph" and eager.loc["traced", "launch"] == "eager"
    assert eager.loc["traced", "kernel_launch_us"] == graph.loc["traced", "kernel_launch_us"] == pytest.approx(4.55)
    assert graph.loc["traced", "graph_node_us"] == pytest.approx(4.15)
    assert pd.isna(eager.loc["traced", "graph_node_us"]) and eager.loc[["paper", "full"], "launch"].isna().all()
    # the paper and full steps do not launch kernel by kernel: a graph leaves them as they were
    pd.testing.assert_frame_equal(eager.loc[["paper", "full"]], graph.loc[["paper", "full"]])
    for column, candidates in (("plain_step_ms", 1), ("medusa_step_ms", 64)):
        rows = trace_step(LLAMA, 1, 512, candidates, "fp16")
        memory_bound = rows["part"].isin(CAPTURED_PARTS) & rows["kind"].isin(MEMORY_KINDS)
        saved_ms = eager.loc["traced", column] - graph.loc["traced", column]
        assert saved_ms == pytest.approx(memory_bound.sum() * (4.55 - 4.15) * 1e-3)
    assert graph.loc["traced", "speedup"] == pytest.approx(3 / graph.loc["traced", "overhead"])


# The same step in three regimes: graph and static share a trace (the static step's), eager has its own.
def regimes(latency, host=None) -> dict:
    tracer = lambda model, batch, context, candidates, dtype: STEP  # noqa: E731
    return {
        regime: TracedStep(LLAMA, latency, "fp16", tracer, regime=regime, host=host)
        for regime in ("eager", "static", "graph")
    }


def test_a_regime_is_priced_end_to_end_eager_never_under_its_graph():
    latency = latency_source("h100-sxm", LLAMA, "fp16")
    steps = regimes(latency)
    graph, eager = (float(steps[r].step_time(1, 512)) for r in ("graph", "eager"))
    spec = latency.spec
    # the graph: every kernel (all 42 non-sync rows) a graph node; no host between them
    kernels = price_trace(
        STEP, latency, "fp16", cuda_graph=True, captured_parts=("forward", "verification", "kv_update")
    )
    assert graph == pytest.approx(float(kernels["time_s"].sum()))
    assert "graph node at 2.09 us (h100-sxm GPU check" in steps["graph"].launch_label
    assert spec.graph_node_us == pytest.approx(2.95)  # the spec's, the fallback
    assert eager >= graph  # the device keeps a node's gap per kernel; the host adds its waits
    assert "h100-sxm spec: kernel_launch_us" in steps["eager"].launch_label


def test_a_slow_host_makes_the_step_host_bound():
    latency = latency_source("h100-sxm", LLAMA, "fp16")
    slow = HostCosts(dict.fromkeys(HOST_KINDS, 50e-6), "a slow host")
    step = regimes(latency, slow)["eager"]
    # 44 ops issued at 50 us each dwarf the kernels: the step is the host's issue time, near enough
    assert float(step.step_time(1, 512)) == pytest.approx(44 * 50e-6, rel=0.05)
    assert "a slow host" in step.launch_label


def test_what_a_regime_cannot_price_is_one_line():
    h100 = latency_source("h100-sxm", LLAMA, "fp16")
    cpu = view_latency(resolve_view("cpu-amd-epyc-2c", None, [], log=lambda _: None), LLAMA, "fp32")
    one_line_error(lambda: TracedStep(LLAMA, h100, "fp16", lambda *a: STEP, regime="compiled"), "fused kernels")
    one_line_error(lambda: TracedStep(LLAMA, cpu, "fp32", lambda *a: STEP, regime="eager"), "host's own thread")
    one_line_error(
        lambda: TracedStep(LLAMA, h100, "fp16", lambda *a: STEP, regime="graph", cuda_graph=True), "leave it out"
    )


def test_the_point_answer_prices_each_launch_regime(tmp_path, capsys):
    point = ["--gpu", "h100", "--model", "llama-7b", "--step", "traced", "--tree-size", "16", "--acceleration", "2"]
    point += ["--batch", "8"]
    rows = {}
    for regime in ("eager", "static", "graph"):
        csv = tmp_path / f"{regime}.csv"
        assert speedup([*point, "--launch", regime, "--csv", str(csv)]) == 0
        rows[regime] = pd.read_csv(csv).set_index("step").loc["traced"]
    out = capsys.readouterr().out
    assert "launch: graph: the static step replayed from a CUDA graph" in out
    assert "launch: eager: the reference decoder's loop, host and device queues" in out
    assert {r: rows[r]["launch"] for r in rows} == {"eager": "eager", "static": "static", "graph": "graph"}
    assert rows["eager"]["plain_kernels"] > rows["graph"]["plain_kernels"]  # the loop's per-sequence kernels
    one_line_error(lambda: speedup(["--gpu", "h100", "--launch", "graph"]), "give --tree-size")
