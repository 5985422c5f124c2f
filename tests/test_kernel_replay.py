"""profilers.kernel_replay: a traced step's own kernel calls run again on real tensors and timed,
the measured side of pricing a trace (the twin's closed loop predicts from it)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from decoder.trace import trace_step
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.kinds import HOST_ONLY_KINDS, kernel_rows
from perfmodel.latency.source import latency_source
from perfmodel.latency.traced import TRACE_COLUMNS, price_trace
from perfmodel.models.config import load_model
from profilers.kernel_replay import KernelTimes, WeightPool, materialize, storage_extent

BUNDLED = load_model("bundled")


@pytest.fixture(scope="module")
def bundled_trace() -> pd.DataFrame:
    """The kernels of a step (its host-only rows, with nothing to replay, left out)."""
    return kernel_rows(trace_step(BUNDLED, 2, 40, 8, "fp32"))


def args_of(call: str) -> list:
    return json.loads(call)[1]


def test_every_call_of_a_medusa_step_replays_and_is_timed(bundled_trace):
    whole = trace_step(BUNDLED, 2, 40, 8, "fp32")
    assert (whole.loc[whole["kind"].isin(HOST_ONLY_KINDS), "call"] == "").all()  # views, module calls: no kernel
    kernels = KernelTimes.of([whole], "cpu", cache_bytes=1 << 20)
    assert kernels.failed == {}
    times = kernels.times()
    assert kernels.rounds >= kernels.timer.min_reps
    assert set(times) == set(bundled_trace["call"])  # every kernel of the step has its time
    assert all(t > 0 for t in times.values())


def test_weights_and_the_kv_cache_are_read_cold_activations_warm():
    trace = trace_step(load_model("llama-7b"), 1, 512, 16, "fp16")
    gemm = trace[(trace["kind"] == "gemm") & (trace["part"] == "forward")].iloc[0]
    activation, weight = args_of(gemm["call"])[:2]
    assert "w" not in activation and weight.get("w") == 1
    attention = trace[trace["kind"] == "attention"].iloc[0]
    q, k, v, mask = args_of(attention["call"])[:4]
    assert [a.get("w") for a in (q, k, v, mask)] == [None, 1, 1, None]
    assert k["t"] == [1, 32, 512 + 16, 128]  # the cache's keys up to the tree's last slot


def test_a_cold_weight_is_rotated_through_copies_that_fill_the_pool():
    pool = WeightPool(torch.device("cpu"), pool_bytes=64 * 1024)
    copies = pool.copies([16, 32], [1, 16], torch.float32)  # a transposed 2 KiB weight
    assert len(copies) == 64 * 1024 // (16 * 32 * 4)
    assert all(c.shape == (16, 32) and c.stride() == (1, 16) for c in copies)
    assert len({c.data_ptr() for c in copies}) == len(copies)  # each copy its own memory
    assert len(pool.copies([256, 256], [256, 1], torch.float32)) == 1  # larger than the pool: cold anyway


def test_a_strided_view_spans_its_storage_and_replays_with_its_strides():
    assert storage_extent([4, 3], [1, 4]) == 12 and storage_extent([2, 5], [10, 1]) == 15
    assert storage_extent([0, 5], [5, 1]) == 0
    call = json.dumps(
        [
            "aten.mm.default",
            [{"t": [4, 8], "s": [8, 1], "d": "float32"}, {"t": [8, 6], "s": [1, 8], "d": "float32"}],
            {},
        ]
    )
    replayed = materialize(call, torch.device("cpu"), WeightPool(torch.device("cpu"), 1 << 16))
    left, right = replayed.variants[0][0]
    assert right.stride() == (1, 8)
    assert replayed.run().shape == (4, 6)


def test_a_call_that_cannot_come_back_is_listed_not_timed(bundled_trace):
    broken = bundled_trace.head(3).copy()
    broken.loc[broken.index[0], "call"] = json.dumps(["aten.add.Tensor", [{"unknown": "<generator>"}], {}])
    broken.loc[broken.index[1], "call"] = json.dumps(["aten.no_such_op.default", [], {}])
    kernels = KernelTimes.of([broken], "cpu", cache_bytes=1 << 20)
    assert len(kernels.failed) == 2
    assert "<generator>" in "".join(kernels.failed.values()) and "no_such_op" in "".join(kernels.failed.values())
    assert len(kernels.calls) == len(set(broken["call"])) - 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gives")
def test_replay_on_cuda_without_a_gpu_says_so(bundled_trace):
    with pytest.raises(PerfkitError, match="no CUDA device"):
        KernelTimes.of([bundled_trace], "cuda", cache_bytes=1 << 20)


def test_price_trace_takes_replayed_times_where_it_has_them(bundled_trace):
    assert "call" in TRACE_COLUMNS
    latency = latency_source("a100-sxm", load_model("llama-7b"), "fp16")
    modelled = price_trace(bundled_trace, latency, "fp16")
    gemm_calls = set(bundled_trace.loc[bundled_trace["kind"] == "gemm", "call"])
    measured = dict.fromkeys(gemm_calls, 1e-3)
    priced = price_trace(bundled_trace, latency, "fp16", measured=measured)
    replayed = priced["call"].isin(gemm_calls)
    assert (priced.loc[replayed, "time_s"] == 1e-3).all()
    assert (priced.loc[replayed, "source"] == "measured (kernel replayed)").all()
    assert priced.loc[~replayed, "time_s"].tolist() == modelled.loc[~replayed, "time_s"].tolist()
