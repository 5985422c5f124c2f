"""The host/device pipeline of an eager step (perfmodel.latency.pipeline) on steps whose answer
is known, and the host-dispatch microbenchmark that prices its host side
(profilers.host_dispatch): measured on this CPU, written, read back, and its command line."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.latency.kinds import HOST_ONLY_KINDS, TRACE_KINDS
from perfmodel.latency.pipeline import (
    HOST_KINDS,
    HostCosts,
    PipelineResult,
    device_seconds,
    price_pipeline,
    run_pipeline,
)
from perfmodel.latency.source import latency_source
from perfmodel.latency.traced import TRACE_COLUMNS, price_trace
from perfmodel.models.config import load_model
from profilers import host_dispatch
from profilers.host_dispatch import CLASSES, HostDispatch, measure_host_dispatch
from tests.helpers import one_line_error

US = 1e-6


def reference(issue, kernel, sync) -> tuple[float, float]:
    """The recurrence of the module doc, op by op: (step seconds, host seconds waiting at syncs)."""
    host = device = wait = 0.0
    for a, k, s in zip(issue, kernel, sync):
        host += a
        device = max(host, device) + k
        if s:
            wait += max(device - host, 0.0)
            host = max(host, device)
    return max(host, device), wait


def costs(**seconds) -> HostCosts:
    return HostCosts(dict.fromkeys(HOST_KINDS, 0.0) | seconds, "test")


# -- the pipeline on hand-made steps ------------------------------------------------------------


def test_long_kernels_issued_for_free_take_the_sum_of_the_kernels():
    result = run_pipeline([0.0] * 4, [10 * US, 20 * US, 30 * US, 40 * US], [False] * 4)
    assert result.total_s == pytest.approx(100 * US)
    assert (result.device_idle_s, result.host_busy_s, result.bound) == (0.0, 0.0, "device")


def test_tiny_kernels_take_the_sum_of_the_issue_times_and_the_last_kernel():
    result = run_pipeline([5 * US] * 10, [0.1 * US] * 10, [False] * 10)
    assert result.total_s == pytest.approx(50.1 * US)  # the device runs each as soon as it is issued
    assert result.host_busy_s == pytest.approx(50 * US) and result.device_busy_s == pytest.approx(1 * US)
    assert result.device_idle_s == pytest.approx(49.1 * US) and result.bound == "host"


def test_without_a_sync_the_host_runs_ahead_and_the_device_catches_up():
    # host: issues at 1, 2, 3; device: 1-11, 11-21, 21-31
    result = run_pipeline([US] * 3, [10 * US] * 3, [False] * 3)
    assert result.total_s == pytest.approx(31 * US) and result.host_wait_s == 0.0


def test_a_sync_in_the_middle_makes_the_host_wait_for_the_device():
    issue = [US, US, 2 * US, US]
    kernel = [10 * US, 10 * US, 0.0, 10 * US]
    sync = [False, False, True, False]
    # kernels 0-1 run 1-11 and 11-21; the host issues the read at 4 and waits to 21;
    # it issues kernel 3 at 22, which runs 22-32
    result = run_pipeline(issue, kernel, sync)
    assert result.total_s == pytest.approx(32 * US)
    assert result.host_wait_s == pytest.approx(17 * US)
    assert result.device_idle_s == pytest.approx(2 * US)  # 0-1 and 21-22
    assert (result.ops, result.syncs, result.bound) == (4, 1, "device")
    assert result.as_dict()["bound"] == "device" and result.as_dict()["total_s"] == result.total_s
    # the same step without the sync overlaps kernel 3's issue with the device's work
    assert run_pipeline(issue, kernel, [False] * 4).total_s == pytest.approx(31 * US)


def test_a_mixed_step_gives_its_known_answer():
    # host-bound stretch (0-5), a sync, a device-bound stretch, a sync at the end
    issue = [2 * US, 2 * US, 1 * US, 1 * US, 3 * US, 1 * US, 1 * US]
    kernel = [1 * US, 1 * US, 0.0, 20 * US, 20 * US, 5 * US, 0.0]
    sync = [False, False, True, False, False, False, True]
    # 0: issued 2, runs 2-3; 1: issued 4, runs 4-5; sync: issued 5, device done at 5, host at 5
    # 3: issued 6, runs 6-26; 4: issued 9, runs 26-46; 5: issued 10, runs 46-51; sync: host 11, waits to 51
    result = run_pipeline(issue, kernel, sync)
    assert result.total_s == pytest.approx(51 * US)
    assert result.host_wait_s == pytest.approx(40 * US)
    assert result.device_busy_s == pytest.approx(47 * US) and result.host_busy_s == pytest.approx(11 * US)
    assert result.device_idle_s == pytest.approx(4 * US)
    assert result.total_s == pytest.approx(reference(issue, kernel, sync)[0])


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorised_pipeline_is_the_op_by_op_recurrence(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    issue = rng.uniform(0, 20 * US, n) * (rng.random(n) < 0.9)
    kernel = rng.exponential(8 * US, n) * (rng.random(n) < 0.8)
    sync = rng.random(n) < [0.0, 0.01, 0.1, 0.5, 0.9, 1.0][seed]
    result = run_pipeline(issue, kernel, sync)
    total, wait = reference(issue, kernel, sync)
    assert result.total_s == pytest.approx(total, rel=1e-9)
    assert result.host_wait_s == pytest.approx(wait, rel=1e-9, abs=1e-15)
    assert result.device_idle_s == pytest.approx(total - kernel.sum(), rel=1e-9, abs=1e-15)


def test_an_empty_step_and_bad_arrays():
    assert run_pipeline([], [], np.array([], dtype=bool)) == PipelineResult(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    one_line_error(lambda: run_pipeline([1.0, 2.0], [1.0], [False, False]), "one value per op", "2, 1 and 2")
    one_line_error(lambda: run_pipeline([-1.0], [1.0], [False]), "issue_s must be finite seconds >= 0")
    one_line_error(lambda: run_pipeline([1.0], [float("nan")], [False]), "kernel_s must be finite")
    one_line_error(lambda: run_pipeline([1.0], [1.0], [1]), "sync must be True or False")


# -- pricing a traced step ----------------------------------------------------------------------


def trace(*kernels: dict) -> pd.DataFrame:
    blank = dict.fromkeys(TRACE_COLUMNS, 0) | {"step": "plain", "part": "forward", "dtype": "fp16", "shapes": ""}
    return pd.DataFrame([blank | {"index": i, "call": f"call{i}"} | k for i, k in enumerate(kernels)])


# bandwidth 1e10 B/s at full efficiency, 7 us per launch: a 1e5-byte kernel runs 10 us
LATENCY = SimpleNamespace(
    spec=SimpleNamespace(name="test device", bandwidth=1e10),
    params=RooflineParams(memory_efficiency=1.0, kernel_overhead_s=7 * US),
)
STEP = trace(
    {"kind": "elementwise", "bytes": 1e5},
    {"kind": "copy", "bytes": 2e5},
    {"kind": "reduction", "bytes": 1e4, "part": "verification"},
    {"kind": "host_sync", "part": "verification"},
    {"kind": "indexing", "bytes": 1e5, "part": "kv_update"},
)


def test_device_seconds_take_the_launch_off_what_price_trace_charged():
    priced = price_trace(STEP, LATENCY, "fp32", measured={"call4": 3 * US})
    assert priced["time_s"].tolist() == pytest.approx([17 * US, 27 * US, 8 * US, 7 * US, 3 * US])
    device = device_seconds(priced, launch_s=7 * US)
    assert device.tolist() == pytest.approx([10 * US, 20 * US, 1 * US, 0.0, 3 * US])  # replayed: kept
    assert device_seconds(priced).tolist() == pytest.approx([17 * US, 27 * US, 8 * US, 0.0, 3 * US])
    graph = priced.assign(source="bytes / bandwidth + graph node")
    one_line_error(lambda: device_seconds(graph, 7 * US), "CUDA graph", "price it eager")
    one_line_error(lambda: device_seconds(STEP), "missing columns time_s")


def test_a_priced_step_through_the_pipeline():
    priced = price_trace(STEP, LATENCY, "fp32")
    host = costs(elementwise=4 * US, copy=4 * US, reduction=4 * US, indexing=4 * US, host_sync=2 * US, python=US)
    # device: 4-14, 14-34, 34-35; sync issued at 14, waits to 35; indexing issued 39, runs 39-49
    result = price_pipeline(priced, host, launch_s=7 * US)
    assert result.total_s == pytest.approx(49 * US) and result.syncs == 1 and result.ops == 5
    # 10 loop items after the sync: the host issues the indexing 10 us later
    later = price_pipeline(priced, host, python_items=10, launch_s=7 * US)
    assert later.total_s == pytest.approx(59 * US) and later.ops == 5
    assert later.host_busy_s == pytest.approx(result.host_busy_s + 10 * US)
    one_line_error(lambda: price_pipeline(priced, host, python_items=-1), "python_items must be a count")
    one_line_error(lambda: price_pipeline(priced.assign(kind="allreduce"), host), "no host cost: allreduce")


# -- host costs and the microbenchmark -----------------------------------------------------------


def test_the_host_prices_every_kind_a_trace_has_and_the_benchmark_times_them_all():
    assert set(TRACE_KINDS) | {"python"} == set(HOST_KINDS) == set(CLASSES)


def test_host_only_ops_cost_the_host_alone():
    from decoder.trace import trace_step  # torch: the decoder's own tracer

    trace = trace_step(load_model("llama-7b"), 1, 512, 1)
    priced = price_trace(trace, latency_source("h100", "llama-7b", "fp16"), "fp16")
    host_only = priced["kind"].isin(HOST_ONLY_KINDS).to_numpy()
    # no time in a kernels' sum, none on the device
    assert host_only.sum() > 1000 and (priced.loc[host_only, "time_s"] == 0).all()
    assert (device_seconds(priced)[host_only] == 0).all()
    # the host pays each at its kind's cost: views 1 us, module calls 2 us, the rest free
    only = price_pipeline(priced.assign(time_s=0.0), costs(view=1 * US, module=2 * US))
    counts = priced["kind"].value_counts()
    assert only.host_busy_s == pytest.approx(counts["view"] * US + counts["module"] * 2 * US)


def test_bad_host_costs_are_one_line_errors(tmp_path):
    one_line_error(lambda: HostCosts({"gemm": 1.0}, "x"), "lack the kinds attention")
    one_line_error(lambda: costs(gemm=-1.0), "host cost of gemm (test)", ">= 0")
    one_line_error(lambda: costs().issue("allreduce"), "no host cost for kernel kind 'allreduce'")
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"format": "something else"}))
    one_line_error(lambda: HostCosts.from_json(path), "other.json", "not a host dispatch file")
    one_line_error(lambda: HostCosts.from_json(tmp_path / "none.json"), "cannot read host dispatch file")


def test_this_cpus_host_dispatch_is_measured_and_read_back_as_host_costs(tmp_path):
    measured = measure_host_dispatch("cpu", quick=True)
    assert list(measured.classes) == list(CLASSES)
    for name, timing in measured.classes.items():
        for seconds in (timing.issue_s, timing.total_s):
            assert np.isfinite(seconds) and 0 < seconds < 0.01, name
        assert len(timing.rounds_issue_s) == 3 and timing.spread >= 0
    assert measured.classes["python"].issue_s < measured.classes["elementwise"].issue_s
    meta = measured.metadata
    assert meta["torch"] and meta["python"] and meta["cpu_model"] and meta["threads"] >= 1
    assert meta["measured_utc"].endswith("Z")
    path = measured.to_json(tmp_path / "host" / "cpu.json")
    assert HostDispatch.from_json(path) == measured
    host = HostCosts.from_json(path)
    assert dict(host.seconds) == {name: t.issue_s for name, t in measured.classes.items()}
    assert "(cpu)" in host.origin and "cpu.json" in host.origin
    for value in (measured, host):  # a sweep hands them to worker processes
        assert pickle.loads(pickle.dumps(value)) == value
    table = measured.table()
    assert table["class"].tolist() == list(CLASSES) and (table["issue_s"] > 0).all()


def test_the_command_writes_its_json_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    out, csv = tmp_path / "hd.json", tmp_path / "hd.csv"
    assert run(host_dispatch.main, ["--device", "cpu", "--quick", "--out", str(out), "--csv", str(csv)]) == 0
    printed = capsys.readouterr().out
    assert "host dispatch on" in printed and "attention" in printed and f"json: {out}" in printed
    assert set(HostCosts.from_json(out).seconds) == set(HOST_KINDS)
    assert pd.read_csv(csv)["class"].tolist() == list(CLASSES)

    with pytest.raises(SystemExit) as exit_:
        host_dispatch.main(["--device", "tpu"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'tpu'" in err

    if not host_dispatch_has_cuda():
        assert run(host_dispatch.main, ["--device", "cuda", "--out", str(tmp_path / "cuda.json")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no CUDA device" in err
        assert not (tmp_path / "cuda.json").exists()


def host_dispatch_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_a_broken_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text("{not json")
    with pytest.raises(PerfkitError, match="cpu.json: not valid JSON"):
        HostDispatch.from_json(path)
