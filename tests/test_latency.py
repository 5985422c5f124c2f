import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import find_spec
from perfmodel.latency.roofline import op_time, predict_table
from perfmodel.measured.contract import COLUMNS
from perfmodel.models.config import load_model
from perfmodel.models.grid import PAPER_GRID, Grid
from perfmodel.models.operators import OPS, op_kernels

A100 = find_spec("a100")
LLAMA_7B = load_model("llama-7b")
PARAMS = RooflineParams()


def test_memory_bound_decode_projection_hand_computed():
    mm = op_kernels("q", "decode", LLAMA_7B, 1, 1024)
    bytes_ = 2 * (4096 + 4096 * 4096 + 4096)
    expected = bytes_ / (1935e9 * 0.88) + 3e-6
    assert op_time(mm, "fp16", A100, PARAMS) == pytest.approx(expected)


def test_compute_bound_prefill_projection_hand_computed():
    mm = op_kernels("up", "prefill", LLAMA_7B, 16, 2048)
    flops = 2 * 16 * 2048 * 4096 * 11008
    assert op_time(mm, "fp16", A100, PARAMS) == pytest.approx(flops / (312e12 * 0.84) + 3e-6)


def test_each_kernel_pays_its_own_overhead():
    model = LLAMA_7B.with_medusa_heads(4)
    free = RooflineParams(kernel_overhead_s=0.0)
    mm = op_kernels("medusa_heads", "decode", model, 1, 128)
    assert op_time(mm, "fp16", A100, PARAMS) - op_time(mm, "fp16", A100, free) == pytest.approx(8 * 3e-6)


def test_paper_grid_table_is_complete_and_below_the_ceilings():
    df = predict_table(A100, LLAMA_7B, "fp16")
    per_op = 49 + 49 + 49 * 8  # prefill, decode, tree with 8 candidate counts
    assert len(df) == len(OPS) * per_op
    assert list(df.columns) == COLUMNS
    assert set(df["source"]) == {"predicted"}
    assert not df[["flops", "bytes", "intensity", "time_s", "tflops"]].isna().any().any()
    roof = (df["intensity"] * 1935e9 * 0.88).clip(upper=312e12 * 0.84) / 1e12
    assert (df["tflops"] <= roof + 1e-9).all()
    keys = ["op", "phase", "batch", "seq_len", "candidates"]
    assert not df.duplicated(keys).any()


def test_narrowed_grid():
    grid = PAPER_GRID.narrowed(batches=[4, 1, 4], candidates=[64])
    assert grid == Grid((1, 4), PAPER_GRID.seq_lens, (64,))
    df = predict_table(A100, LLAMA_7B, "bf16", grid, ops=("qk",), phases=("tree",))
    assert len(df) == 2 * 7 and set(df["candidates"]) == {64}


@pytest.mark.parametrize("kwargs", [{"compute_efficiency": 0}, {"memory_efficiency": 1.2}, {"kernel_overhead_s": -1}])
def test_params_are_validated(kwargs):
    with pytest.raises(PerfkitError):
        RooflineParams(**kwargs)
