"""One point's answer (python -m perfmodel.speedup --tree-size T --acceleration A) and the
pricing of a traced step (perfmodel.latency.traced)."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import find_spec
from perfmodel.latency.source import latency_source
from perfmodel.latency.traced import TRACE_COLUMNS, kind_shares, price_trace
from perfmodel.models.config import load_model
from perfmodel.models.operators import Matmul
from reports.commands.speedup import main as speedup
from tests.helpers import one_line_error

LLAMA = load_model("llama-7b")
POINT = ["--gpu", "a100-sxm", "--model", "llama-7b", "--batch", "2", "--context", "256"]


def rows(*kernels: dict) -> pd.DataFrame:
    """A trace table of the kernels given (every other column 0)."""
    blank = dict.fromkeys(TRACE_COLUMNS, 0) | {"step": "plain", "part": "forward", "dtype": "fp16", "shapes": ""}
    return pd.DataFrame([blank | {"index": i} | k for i, k in enumerate(kernels)])


def test_the_point_answer_is_acceleration_over_overhead_for_each_step(tmp_path, capsys):
    csv = tmp_path / "point.csv"
    assert speedup([*POINT, "--step", "both", "--tree-size", "64", "--acceleration", "3.0", "--csv", str(csv)]) == 0
    table = pd.read_csv(csv)
    assert list(table["step"]) == ["paper", "full"]
    assert (table["medusa_step_ms"] > table["plain_step_ms"]).all()
    assert table["overhead"].to_numpy() == pytest.approx((table["medusa_step_ms"] / table["plain_step_ms"]).to_numpy())
    assert table["speedup"].to_numpy() == pytest.approx((3.0 / table["overhead"]).to_numpy())
    # the paper's step is one layer's eight matmuls; the full step launches every layer's ops
    assert table.set_index("step")["plain_kernels"].to_dict() == {"paper": 8, "full": 388}
    out = capsys.readouterr().out
    assert "full: plain step" in out and "overhead" in out and "speedup" in out


def test_bad_point_questions_are_one_line_errors():
    one_line_error(lambda: speedup([*POINT, "--acceleration", "3"]), "--acceleration", "--tree-size")
    one_line_error(lambda: speedup([*POINT, "--tree-size", "64"]), "--tree-size needs --acceleration")
    one_line_error(lambda: speedup([*POINT, "--tree-size", "1", "--acceleration", "2"]), "--tree-size 1", ">= 2")
    one_line_error(lambda: speedup([*POINT, "--tree-size", "8", "--acceleration", "0.5"]), "--acceleration 0.5")
    one_line_error(lambda: speedup([*POINT, "--cuda-graph"]), "--cuda-graph prices one point's traced step")
    one_line_error(
        lambda: speedup([*POINT, "--tree-size", "8", "--acceleration", "2", "--cuda-graph"]),
        "--cuda-graph prices the traced step's launches",
        "not both",
    )


def test_memory_bound_kernels_cost_their_bytes_at_the_bandwidth_plus_the_launch():
    spec, params = find_spec("a100-sxm"), RooflineParams()
    latency = latency_source("a100-sxm", LLAMA, "fp16", "datasheet")
    priced = price_trace(
        rows({"kind": "elementwise", "bytes": 8e6}, {"kind": "copy", "bytes": 0}, {"kind": "host_sync"}),
        latency,
        "fp16",
    )
    launch = spec.kernel_launch_us * 1e-6  # the spec's eager launch, not the roofline's 3 us
    expected = 8e6 / (spec.bandwidth * params.memory_efficiency) + launch
    assert priced["time_s"].tolist() == pytest.approx([expected, launch, launch])


def test_a_traced_gemm_is_priced_by_the_latency_source_and_shares_add_up():
    latency = latency_source("h100-sxm", LLAMA, "fp16")  # Vidur's profiles: a measured source
    priced = price_trace(
        rows({"kind": "gemm", "batch": 1, "m": 16, "k": 4096, "n": 11008}, {"kind": "elementwise", "bytes": 1e5}),
        latency,
        "fp16",
    )
    assert priced["time_s"].iloc[0] == pytest.approx(float(latency.gemm_time(Matmul(1, 16, 4096, 11008, True))))
    shares = kind_shares(priced)
    assert list(shares["kind"]) == ["gemm", "elementwise"] and shares["share"].sum() == pytest.approx(1.0)


def test_a_table_that_is_not_a_trace_is_refused():
    latency = latency_source("a100-sxm", LLAMA, "fp16", "datasheet")
    one_line_error(lambda: price_trace(pd.DataFrame({"kind": ["gemm"]}), latency, "fp16"), "missing columns")
    one_line_error(lambda: price_trace(rows({"kind": "magic"}), latency, "fp16"), "unknown kernel kinds magic")
