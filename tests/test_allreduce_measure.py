"""python -m profilers.allreduce: all-reduce timed with torch.distributed (2 gloo processes
on this machine), written as data-contract rows, and the planner pricing tensor
parallelism with them where they are stored."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import one_line_error

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.latency.allreduce import all_reduce_source
from perfmodel.latency.allreduce_tables import MeasuredAllReduce, stack_names
from perfmodel.latency.tensor_parallel import usable_degrees
from perfmodel.measured import collectives
from perfmodel.measured.collectives import FOLDER, OP, PHASE, file_name
from perfmodel.measured.contract import COLUMNS, read_table
from perfmodel.measured.device_view import resolve_view
from perfmodel.measured.store import user_measurements_dir
from perfmodel.models.config import load_model
from perfmodel.planning.capacity import plan
from profilers.allreduce import main, message_size
from profilers.collectives import (
    QUICK_SIZES,
    CollectiveConfig,
    SizeTiming,
    check_sizes,
    contract_row,
    keep_sampling,
)
from profilers.device import DeviceInfo
from profilers.store import Journal
from profilers.timer import TimerConfig

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "decoder" / "assets" / "bundled"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[Path, str]:
    """One real run: 2 gloo processes, the quick sizes (a few seconds); its file and output."""
    out = tmp_path_factory.mktemp("allreduce") / "gloo.csv"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert run(main, ["--device", "cpu", "--ranks", "2", "--quick", "--out", str(out)]) == 0
    return out, printed.getvalue()


def test_a_quick_run_writes_one_contract_row_per_size(quick_run):
    out, stdout = quick_run
    rows = read_table(out)  # checks the contract's columns and sources
    assert list(rows.columns[: len(COLUMNS)]) == COLUMNS
    assert sorted(rows["bytes"]) == list(QUICK_SIZES)
    assert set(rows["op"]) == {OP} and set(rows["phase"]) == {PHASE} and set(rows["source"]) == {"measured"}
    assert set(rows["batch"]) == {2} and set(rows["candidates"]) == {1} and set(rows["backend"]) == {"gloo"}
    assert (rows["seq_len"] * 4 == rows["bytes"]).all()  # fp32 elements per rank
    assert (rows["time_s"] > 0).all() and rows["noise"].map(math.isfinite).all()
    assert rows["model"].isna().all()  # an all-reduce is the device's, not a model's
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())["runs"]
    assert list(meta) == list(rows["run_id"].unique())
    run_meta = next(iter(meta.values()))
    assert run_meta["backend"] == "gloo" and run_meta["ranks"] == 2 and run_meta["device"]["kind"] == "cpu"
    assert "16 MiB" in stdout and f"{out}: 3 rows (3 measured now)" in stdout


def test_bigger_messages_take_longer(quick_run):
    times = read_table(quick_run[0]).set_index("bytes")["time_s"]
    # 4 KiB against 16 MiB: 4096x the bytes, far beyond this machine's noise
    assert times[16 * 1024**2] > 3 * times[4096]


def test_a_rerun_measures_nothing_again(quick_run, capsys):
    out = quick_run[0]
    before = out.read_text()
    assert run(main, ["--device", "cpu", "--ranks", "2", "--quick", "--out", str(out)]) == 0
    assert "nothing to do: all 3 sizes" in capsys.readouterr().out
    assert out.read_text() == before


@pytest.fixture
def only_the_home(monkeypatch):
    """All-reduce rows from this test's measurements home only: the CPU measured for the
    toolkit ships its own, which would time the CPU before the test stores any."""
    monkeypatch.setattr(collectives, "measurement_roots", lambda: [user_measurements_dir()])


def store_for_the_cpu_view(rows_file: Path) -> str:
    """File the run's rows in the measurements home under the CPU the planner's `cpu` view
    prices: this machine's key, or the stored CPU that stands in for it on a machine not
    measured (the rows then say that device, as rows stored under it must)."""
    key = resolve_view("cpu", None, [], log=lambda _: None).spec.key
    folder = user_measurements_dir() / key / FOLDER
    folder.mkdir(parents=True)
    stored = folder / file_name("gloo", "fp32", 2)
    pd.read_csv(rows_file, keep_default_na=False).assign(device=key).to_csv(stored, index=False)
    shutil.copy(rows_file.with_name(rows_file.name + ".meta.json"), stored.with_name(stored.name + ".meta.json"))
    return key


def test_the_planner_times_cpu_all_reduces_with_stored_rows(quick_run, only_the_home):
    one_line_error(lambda: all_reduce_source("cpu"), "no all-reduce measurements", "python -m profilers.allreduce")
    key = store_for_the_cpu_view(quick_run[0])
    view = resolve_view("cpu", None, [], log=lambda _: None)
    source = all_reduce_source("cpu" if view.stand_in_for is None else key)  # `cpu`: this machine's key
    assert isinstance(source, MeasuredAllReduce) and source.workers == (2,)
    assert f"measured: torch.distributed gloo all_reduce (fp32) on {key}, run " in source.label
    assert "2 ranks, 4 KiB-16 MiB" in source.label
    rows = read_table(quick_run[0]).set_index("bytes")["time_s"]
    assert source.time(4096, 2) == pytest.approx(rows[4096])  # exact at a measured size
    assert stack_names(key) == ["torch-gloo"]
    one_line_error(lambda: source.time(4096, 4), "over 4 ranks", "measured worker counts: 2", "--ranks 4")
    assert 2 in usable_degrees(load_model(BUNDLED), view.spec)


def test_a_tp2_plan_on_the_cpu_is_priced_by_the_measured_rows(quick_run, only_the_home):
    with pytest.raises(PerfkitError, match="no interconnect"):
        plan(BUNDLED, "cpu", tensor_parallel=2)
    store_for_the_cpu_view(quick_run[0])
    result = plan(BUNDLED, "cpu", tensor_parallel=2)
    device = result.devices.iloc[0]
    assert device["tensor_parallel"] == 2
    label = device["latency_model"]
    assert "tp=2: 2 all-reduces per layer, measured: torch.distributed gloo all_reduce (fp32)" in label


def nccl_rows(folder: Path, device: str, seconds: float) -> Path:
    """A torch-nccl run's rows over 2 GPUs, as profilers.collectives writes them."""
    info = DeviceInfo("cuda", device, device, device, 0, 0, 1, {})
    config = CollectiveConfig("cuda", 2, "fp16", (8192, 1 << 20))
    out = folder / device / FOLDER / file_name("nccl", "fp16", 2)
    journal = Journal(out, extra_columns=("backend",))
    for nbytes in config.sizes:
        journal.append(contract_row(info, config, SizeTiming(nbytes, 1, (seconds, seconds)), "run-1"))
    return out


def test_own_rows_come_before_imported_nccl_tables_per_gpu_count():
    imported = all_reduce_source("h200")
    nccl_rows(user_measurements_dir(), "h200", 1e-3)
    source = all_reduce_source("h200")
    assert stack_names("h200")[:2] == ["torch-nccl", "nccl"]
    assert source.time(8192, 2) == pytest.approx(1e-3)  # ours for 2 GPUs
    assert source.time(8192, 8) == imported.time(8192, 8)  # the NCCL tables for 4 and 8
    assert "torch.distributed nccl all_reduce (fp16) on h200, run run-1, 2 GPUs" in source.label_for(2)
    assert "NCCL 2.29.2" in source.label_for(8)
    assert all_reduce_source("h200", stack="nccl").time(8192, 2) == imported.time(8192, 2)
    assert all_reduce_source("h200", stack="torch-nccl").workers == (2,)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ranks", "1"], "--ranks 1: an all-reduce needs at least 2 ranks"),
        (["--dtype", "int8"], "--dtype 'int8': all-reduce is timed in fp16, bf16, fp32"),
        (["--dtype", "fp64"], "--dtype 'fp64': all-reduce is timed in fp16, bf16, fp32"),
        (["--sizes", "6"], "message size 6 B: must be a multiple of fp32's 4 B"),
        (["--budget", "-1"], "--budget -1: must be a number of seconds >= 0"),
        (["--out", "x.parquet"], "use a .csv file name"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert run(main, ["--device", "cpu", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_cuda_without_a_gpu_is_one_clear_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert run(main, ["--device", "cuda", "--ranks", "2"]) == 1
    err = capsys.readouterr().err
    assert "no CUDA device is visible" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--ranks", "0"], ["--sizes", "0"], ["--sizes", "8XB"], ["--device", "tpu"]])
def test_usage_errors_are_one_line(capsys, args):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_sizes_take_binary_units():
    assert [message_size(t) for t in ("8192", "8K", "8KiB", "64MiB", "1g")] == [8192, 8192, 8192, 64 << 20, 1 << 30]
    assert check_sizes([8192, 4096, 8192], "fp16") == (4096, 8192)
    one_line_error(lambda: check_sizes([2], "fp32"), "multiple of fp32's 4 B")


def test_rounds_stop_on_the_samples_every_rank_shares():
    timer = TimerConfig(min_reps=3, max_reps=6, target_noise=0.05, budget_s=1.0)
    steady, noisy = [1e-3] * 3, [1e-3, 3e-3, 1e-3]
    assert keep_sampling([[1e-3] * 2, [1e-3] * 2], [1, 1], timer)  # fewer than min_reps
    assert not keep_sampling([steady, steady], [1, 1], timer)  # every size settled
    assert keep_sampling([steady, noisy], [1, 1], timer)  # one is not, and budget is left
    assert not keep_sampling([steady, noisy], [1, 400], timer)  # 400 calls x 5 ms > 1 s per size
    assert not keep_sampling([[1e-3, 3e-3] * 3] * 2, [1, 1], timer)  # max_reps
