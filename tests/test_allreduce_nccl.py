"""Tensor-parallel all-reduces timed by the device's measured NCCL tables (aiconfigurator-core's
nccl-tests runs, shipped under profilers/measurements/<device>/aiconfigurator/nccl-<version>/),
Vidur's tables on request, the ring model where a device has neither."""

import shutil

import numpy as np
import pandas as pd
import pytest

from perfmodel import allreduce_compare
from perfmodel.hardware.specs import find_spec
from perfmodel.latency.allreduce import all_reduce_source, tp_comm_time_per_step
from perfmodel.latency.allreduce_fit import decode_sizes, nccl_errors
from perfmodel.latency.allreduce_ring import RingAllReduce
from perfmodel.latency.allreduce_tables import MeasuredAllReduce, stack_names
from perfmodel.latency.tensor_parallel import tensor_parallel_steps, usable_degrees
from perfmodel.measured.device_view import resolve_view
from perfmodel.measured.store import HOME_VARIABLE, MEASUREMENTS_DIR
from perfmodel.measured.vidur import TABLE_COLUMNS, read_table, table_path
from perfmodel.models.config import load_model
from perfmodel.planning.capacity import plan
from tests.helpers import one_line_error

H200_NCCL = MEASUREMENTS_DIR / "h200" / "aiconfigurator" / "nccl-2.29.2" / "all_reduce.parquet"
H200_VLLM = MEASUREMENTS_DIR / "h200" / "aiconfigurator" / "vllm-0.24.0" / "custom_all_reduce.parquet"


def interpolated(path, workers: int, nbytes: float) -> float:
    """The table's time at `nbytes`, straight from its rows: log-log between the two measured
    sizes around it (the median of a size measured twice)."""
    rows = pd.read_parquet(path)
    rows = rows[rows["num_workers"] == workers].groupby("bytes")["time_s"].median()
    sizes, times = rows.index.to_numpy(dtype=float), rows.to_numpy()
    i = np.searchsorted(sizes, nbytes) - 1
    assert sizes[i] < nbytes < sizes[i + 1]  # between two measured sizes: interpolation is exercised
    f = np.log(nbytes / sizes[i]) / np.log(sizes[i + 1] / sizes[i])
    return times[i] * (times[i + 1] / times[i]) ** f


def test_the_planners_tp_step_on_h200_pays_the_engines_own_all_reduce_table():
    """The H200's latency rests on the vLLM grid, so its all-reduces are vLLM's own."""
    model, batch, size = load_model("llama-2-70b"), 3, 16
    shard = model.shard(8)
    result = plan("llama-2-70b", "h200", tensor_parallel=8, batches=[batch], sizes=[size])
    label = result.devices.iloc[0]["latency_model"]
    assert (
        "tp=8: 2 all-reduces per layer, measured: vLLM 0.24.0 custom all-reduce (CUDA-graph kernel) on h200_sxm"
        in label
    )
    assert "aiconfigurator-core 0.12.0" in label and "ring" not in label
    # 80 layers x 2 all-reduces of 3 x 16 tokens x 8192 x 2 bytes (768 KiB, between the table's 512 KiB and 1 MiB)
    expected_comm = 2 * model.num_layers * interpolated(H200_VLLM, 8, batch * size * model.hidden_size * 2)
    comm = tp_comm_time_per_step(shard, 8, batch * size, "fp16", all_reduce_source("h200", stack="vllm"))
    assert comm == pytest.approx(expected_comm, rel=1e-12)
    step = tensor_parallel_steps(resolve_view("h200", None, []), model, "fp16", 8)["full"]
    gather = float(step.gather_time(batch, size, True))  # the logits of the tree and of the heads
    assert 0 < gather < 0.1 * expected_comm
    compute = step.shard_step.step_time(batch, result.workload.step_context, size)
    step_s = result.configs.set_index("tree_size").loc[size, "medusa_step_s"]
    assert step_s == pytest.approx(float(compute) + expected_comm + gather)
    assert float(step.comm_time(batch, size)) == pytest.approx(expected_comm, rel=1e-12)
    # NCCL's own benchmark times the same all-reduce slower than the engine's kernel
    nccl = tensor_parallel_steps(resolve_view("h200", None, []), model, "fp16", 8, all_reduce_stack="nccl")["full"]
    assert "NCCL 2.29.2" in nccl.label
    assert float(nccl.comm_time(batch, size)) == pytest.approx(
        2 * model.num_layers * interpolated(H200_NCCL, 8, batch * size * model.hidden_size * 2), rel=1e-12
    )


@pytest.mark.parametrize(
    "device, version, system",
    [("a100-sxm", "2.27.3", "a100_sxm"), ("h100-sxm", "2.29.2", "h100_sxm"), ("l40s", "2.27.3", "l40s")],
)
def test_every_imported_device_uses_its_newest_nccl_table_by_default(device, version, system):
    source = all_reduce_source(device)
    assert isinstance(source, MeasuredAllReduce) and source.workers == (2, 4, 8)
    assert f"NCCL {version} all_reduce_perf (nccl-tests) on {system}" in source.label
    assert {t.stack for t in source.tables.values()} == {f"nccl-{version}"}
    assert usable_degrees(load_model("llama-2-70b"), resolve_view(device, None, []).spec) == [1, 2, 4, 8]


def test_a_degree_is_usable_only_where_its_all_reduce_and_logits_gather_were_measured():
    seventy = load_model("llama-2-70b")
    assert usable_degrees(seventy, find_spec("b200")) == [1, 2, 4, 8]
    # A GB200 or GB300 tray holds 4 GPUs: NCCL's tables stop there, so tp 8 is left out of
    # --tp auto, even where an engine's own all-reduce reaches 8 (TensorRT-LLM's on the GB300):
    # the logits gather over 8 was never measured.
    for device in ("gb200", "gb300"):
        assert usable_degrees(seventy, find_spec(device)) == [1, 2, 4]
    assert 8 in all_reduce_source("gb300", stack="trtllm-1.3.0rc20").workers
    assert usable_degrees(seventy, find_spec("gb300"), all_reduce_stack="trtllm-1.3.0rc20") == [1, 2, 4]


def test_a_device_without_tables_falls_back_to_the_ring_model_and_says_so():
    model = load_model("llama-7b")
    assert stack_names("a40") == []
    source = all_reduce_source("a40")
    assert isinstance(source, RingAllReduce) and source.label.startswith("modelled: ring all-reduce over nvlink3")
    result = plan("llama-7b", "a40", tensor_parallel=2, batches=[4], sizes=[16])
    assert "tp=2: 2 all-reduces per layer, modelled: ring all-reduce" in result.devices.iloc[0]["latency_model"]
    step = tensor_parallel_steps(resolve_view("a40", None, []), model, "fp16", 2)["full"]
    # one ring all-reduce over 2 GPUs: a reduce-scatter and an all-gather of bytes / 2 at the
    # spec's 112.5 GB/s / 2 per direction x the fitted efficiency, plus 2 latency steps
    nbytes = 4 * 16 * model.hidden_size * 2
    ring = nbytes / (source.efficiency * 112.5e9 / 2) + 2 * source.latency_s
    assert float(step.comm_time(4, 16)) == pytest.approx(2 * model.num_layers * ring)


def test_a_stack_asks_for_vidurs_tables_or_one_nccl_version():
    engines = ["sglang-0.5.14", "trtllm-1.3.0rc20", "vllm-0.24.0"]
    assert stack_names("h100-sxm") == ["nccl", "nccl-2.27.3", "nccl-2.29.2", *engines, "vidur"]
    assert stack_names("h200") == ["nccl", "nccl-2.26.2", "nccl-2.29.2", *engines]
    vidur = all_reduce_source("h100", stack="vidur")
    assert "Vidur h100_dgx table" in vidur.label
    old = all_reduce_source("h100", stack="nccl-2.27.3")
    assert "NCCL 2.27.3" in old.label
    default, nccl = all_reduce_source("h100"), all_reduce_source("h100", stack="nccl")
    assert default.label == nccl.label and "NCCL 2.29.2" in default.label
    # The choice matters: at 8 KiB over 4 GPUs Vidur's eager calls take several times NCCL's.
    assert vidur.time(8192, 4) > 3 * default.time(8192, 4)
    view = resolve_view("h100", None, [])
    step = tensor_parallel_steps(view, load_model("llama-2-70b"), "fp16", 4, all_reduce_stack="vidur")["full"]
    assert "Vidur h100_dgx table" in step.label
    trtllm = all_reduce_source("h100", stack="trtllm")
    assert trtllm.label == all_reduce_source("h100", stack="trtllm-1.3.0rc20").label
    assert "TensorRT-LLM 1.3.0rc20 AllReduce op on h100_sxm" in trtllm.label
    assert float(step.comm_time(1, 1)) == pytest.approx(2 * 80 * vidur.time(8192 * 2, 4))


def test_a_bad_stack_is_a_one_line_error_naming_the_allowed_ones():
    one_line_error(lambda: all_reduce_source("h200", stack="mpi"), "'mpi'", "h200", "nccl, nccl-2.26.2, nccl-2.29.2")
    one_line_error(lambda: all_reduce_source("h200", stack="vidur"), "'vidur'", "nccl, nccl-2.26.2, nccl-2.29.2")
    one_line_error(lambda: all_reduce_source("h100", stack="nccl-2.18"), "'nccl-2.18'", "vllm-0.24.0, vidur")
    one_line_error(lambda: all_reduce_source("a40", stack="nccl"), "a40 has no measured all-reduce tables")
    one_line_error(lambda: all_reduce_source("h100", "ring", stack="nccl"), "takes no stack", "'nccl'")
    one_line_error(lambda: all_reduce_source("h100", "pairwise_nvlink", stack="nccl"), "stack 'vidur'")
    view, model = resolve_view("h200", None, []), load_model("llama-2-70b")
    one_line_error(lambda: tensor_parallel_steps(view, model, "fp16", 8, all_reduce_stack="gloo"), "'gloo'")
    one_line_error(lambda: usable_degrees(model, view.spec, all_reduce_stack="gloo"), "'gloo'")


def test_a_size_measured_twice_is_timed_at_the_median_of_both():
    # nccl-2.26.2 on h200 holds two runs of every size
    path = MEASUREMENTS_DIR / "h200" / "aiconfigurator" / "nccl-2.26.2" / "all_reduce.parquet"
    rows = pd.read_parquet(path)
    rows = rows[(rows["num_workers"] == 8) & (rows["bytes"] == 1 << 20)]
    assert len(rows) == 2 and rows["time_s"].nunique() == 2
    source = all_reduce_source("h200", stack="nccl-2.26.2")
    assert source.time(1 << 20, 8) == pytest.approx(rows["time_s"].mean())


def test_a_newer_nccl_version_takes_over_the_gpu_counts_it_measured(tmp_path, monkeypatch):
    # A user's import of a newer NCCL that measured 2 GPUs only: it times 2 GPUs, 2.29.2 the rest.
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path))
    folder = tmp_path / "measurements" / "h200" / "aiconfigurator" / "nccl-2.30.1"
    folder.mkdir(parents=True)
    shutil.copy(H200_NCCL.parent / "provenance.json", folder / "provenance.json")
    (folder / "provenance.json").write_text((folder / "provenance.json").read_text().replace("2.29.2", "2.30.1"))
    rows = pd.read_parquet(H200_NCCL)
    rows = rows[rows["num_workers"] == 2].assign(time_s=lambda r: r["time_s"] / 2)
    rows.to_parquet(folder / "all_reduce.parquet", index=False)
    source = all_reduce_source("h200")
    assert {w: t.stack for w, t in source.tables.items()} == {2: "nccl-2.30.1", 4: "nccl-2.29.2", 8: "nccl-2.29.2"}
    assert (
        "NCCL 2.30.1 all_reduce_perf (nccl-tests) on h200_sxm, from aiconfigurator-core 0.12.0, 2 GPUs" in source.label
    )
    assert "NCCL 2.29.2" in source.label_for(8) and "2.30.1" not in source.label_for(8)
    assert source.time(1 << 20, 2) == pytest.approx(all_reduce_source("h200", stack="nccl-2.29.2").time(1 << 20, 2) / 2)


def test_compare_command_prints_the_ring_models_error_against_every_nccl_table(capsys):
    assert allreduce_compare.main([]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[1:2] and line.split()[1].startswith("nccl")]
    errors = nccl_errors()
    # a100-sxm, l40s, rtx-pro-6000: one table; h100-sxm, h200, b300: two; b200: four (2, 4 and 8 GPUs
    # each); gb200, gb300: two of 2 and 4 GPUs (a compute tray's four)
    assert len(rows) == len(errors) == 3 * 3 + 3 * 2 * 3 + 4 * 3 + 2 * 2 * 2 == 47
    h200 = errors.set_index(["device", "table", "workers"]).loc[("h200", "nccl-2.29.2", 8)]
    (printed,) = [r for r in rows if r[:2] == ["h200", "nccl-2.29.2*"] and r[5] == "8"]  # * = the default table
    assert h200["default"] and printed[2:7] == ["nvlink4", "900", "GB/s", "8", "21"]
    assert printed[7:10] == [
        f"{h200['median_abs_err']:.1%}",
        f"{h200['p90_abs_err']:.1%}",
        f"{h200['median_err']:+.1%}",
    ]
    assert "40 sizes 8 KiB-64 MiB" in out and "Vidur's DGX tables vs the default NCCL tables" in out
    sizes = decode_sizes()
    assert sizes[0] == 1 * 1 * 4096 * 2 and sizes[-1] == 64 * 64 * 8192 * 2


def test_one_reader_checks_both_kinds_of_table(tmp_path):
    nccl, vidur = read_table(H200_NCCL), read_table(table_path("h100-sxm", "dgx"))
    assert list(nccl.columns) == list(vidur.columns) == TABLE_COLUMNS
    bad = nccl.assign(time_s=nccl["time_s"].where(nccl["bytes"] != 4096, 0.0))
    bad.to_parquet(tmp_path / "zero.parquet", index=False)
    one_line_error(lambda: read_table(tmp_path / "zero.parquet"), "zero.parquet", "time_s", "positive")
    nccl.drop(columns="run_id").to_parquet(tmp_path / "short.parquet", index=False)
    one_line_error(lambda: read_table(tmp_path / "short.parquet"), "short.parquet", "missing column(s) run_id")
    (tmp_path / "text.parquet").write_text("not parquet")
    one_line_error(lambda: read_table(tmp_path / "text.parquet"), "cannot read all-reduce table", "text.parquet")
