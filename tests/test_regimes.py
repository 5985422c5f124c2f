"""Each launch regime's error from the model alone (profilers.closed_loop.regimes): a twin
run's measured steps beside the traced step's price in the regime they ran in."""

from __future__ import annotations

import pandas as pd
import pytest

from decoder.trace import StepTracer
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.latency.source import decoder_latency
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import gpu_view
from perfmodel.models.config import load_model
from profilers.closed_loop import regimes

RUN = regimes.MEASUREMENTS_DIR / "h100-sxm/gpu-check-2026-11-27/twin/llama-2-7b-fp16.csv"


def test_each_step_is_priced_in_its_runs_regime_from_its_shape_alone():
    run_rows = pd.read_csv(RUN)
    priced = regimes.priced_run(run_rows, "h100", None)
    assert set(priced["launch"]) == {"eager"}  # a run from before the launch column ran eager
    model = load_model("llama-2-7b")
    step = TracedStep(
        model,
        decoder_latency(gpu_view("h100", None, []), model, "fp16"),
        "fp16",
        StepTracer(beyond_context=True),
        regime="eager",
    )
    row = priced.iloc[-1]
    expected = float(step.step_time(row["batch"], row["context"], row["tree_size"]))
    assert row["model_step_s"] == pytest.approx(expected, rel=1e-12)
    assert row["model_error"] == pytest.approx(expected / row["measured_step_s"] - 1)
    assert "torch 2.11.0+cu130 harness" in row["latency"] and "kernel_launch_us" in row["host"]


def test_every_shipped_run_is_priced_each_at_its_own_hosts_costs(capsys):
    shipped = regimes.shipped_runs("h100")  # what a bare --gpu h100 prices (its docs sample: every step)
    assert [f"{p.parent.parent.name}/{p.name}" for p in shipped] == [
        "campaign-2026-11-24/llama-2-7b-fp16.csv",
        "gpu-check-2026-11-27/llama-2-7b-fp16.csv",
        "gpu-check-2026-11-28/llama-2-7b-fp16-graph.csv",
        "gpu-check-2026-11-28/llama-2-7b-fp16-static.csv",
        "gpu-check-2026-11-28/llama-2-7b-fp16.csv",
    ]
    runs = [str(p) for p in shipped if p.stem.endswith(("-graph", "-static"))] + [str(shipped[1])]
    assert run(regimes.main, ["--gpu", "h100", *runs]) == 0
    out = capsys.readouterr().out
    for summed in ("graph: 9 steps", "static: 6 steps", "eager: 8 steps"):
        assert summed in out
    assert "within 15%:" in out and "within 10%:" in out
    # a run with a host-dispatch file beside it is priced at it, an older one at the spec's
    assert "host of gpu-check-2026-11-27: host costs in us per op (h100-sxm spec" in out
    assert "host of gpu-check-2026-11-28: host costs in us per op (NVIDIA H100 80GB HBM3 (cuda)" in out


def test_a_run_of_two_regimes_or_a_device_without_runs_is_one_line():
    mixed = pd.read_csv(RUN).assign(launch=["eager", "graph"] * 4)
    with pytest.raises(PerfkitError, match="several launch regimes: eager, graph"):
        regimes.run_launch(mixed)
    with pytest.raises(PerfkitError, match="no twin runs are shipped for a100-sxm"):
        regimes.shipped_runs("a100-sxm")


def test_bad_runs_and_host_files_are_one_line(tmp_path, capsys):
    assert run(regimes.main, ["--gpu", "h100", str(tmp_path / "none.csv")]) == 1
    assert "none.csv: no such file" in capsys.readouterr().err
    assert run(regimes.main, ["--gpu", "h100", "--host-dispatch", str(tmp_path / "none.json")]) == 1
    assert "cannot read host dispatch file" in capsys.readouterr().err


def test_a_gpu_checks_run_is_priced_at_the_host_costs_measured_beside_it(capsys):
    # the H200 check measured its host's costs beside its twin runs; the H100's runs have none
    h200_run = regimes.MEASUREMENTS_DIR / "h200/gpu-check-2026-11-27/twin/llama-2-7b-fp16.csv"
    assert "gemm 16.16" in regimes.run_host(h200_run, None).label()
    assert regimes.run_host(RUN, None) is None
    # its eager run, traced on one layer (the graph run's static step is traced whole, some 15 s:
    # docs/results/regimes.md shows the command over both, and its docs test runs it)
    assert run(regimes.main, ["--gpu", "h200", str(h200_run)]) == 0
    out = capsys.readouterr().out
    assert "host: host costs in us per op (NVIDIA H200 (cuda)" in out and "gemm 16.16" in out
    assert "eager: 9 steps" in out and "graph:" not in out
