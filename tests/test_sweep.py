import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.measured.contract import check_table
from perfmodel.measured.store import read_meta
from perfmodel.models.grid import PAPER_GRID, QUICK_GRID, Grid, fine_token_grid
from perfmodel.models.operators import DEFAULT_OPS, op_cost
from profilers import sweep as sweep_command
from profilers import sweep_runs, sweeper
from profilers.benchmarks import OpBenchmark
from profilers.device import torch_threads
from profilers.store import ROW_COLUMNS, Journal
from profilers.sweep import main
from profilers.sweep_runs import run_sweep
from profilers.sweeper import SweepConfig
from profilers.timer import TimerConfig
from tests.conftest import TINY

ROOT = Path(__file__).resolve().parents[1]
GRID = Grid(batches=(1, 2), seq_lens=(8,), candidates=(1, 4))
# The flush still runs before every sample, over 1 MiB: evicting twice a CPU's last-level cache costs a
# sample 66 ms on a machine whose virtual CPUs report the host's 480 MiB L3, and these tests check rows.
FAST = TimerConfig(warmup=1, min_reps=3, max_reps=10, budget_s=0.02, flush_bytes=1 << 20)
KEYS = ["device", "model", "dtype", "op", "phase", "batch", "seq_len", "candidates"]


def config(tmp_path: Path, **changes) -> SweepConfig:
    base = SweepConfig(
        "cpu",
        TINY,
        "fp32",
        GRID,
        tmp_path / "sweep.csv",
        ops=("up", "qk", "sdpa"),
        timer=FAST,
        ceilings=False,
        progress=False,
    )
    return SweepConfig(**{**base.__dict__, **changes})


def test_rows_follow_the_data_contract(tmp_path):
    result = run_sweep(config(tmp_path), log=lambda *_: None)
    rows = pd.read_csv(result.out)
    assert list(rows.columns) == ROW_COLUMNS
    check_table(rows)
    assert len(rows) == result.total_rows == result.measured == 3 * (2 + 2 + 4)
    assert set(rows["source"]) == {"measured"} and set(rows["status"]) == {"ok"} and set(rows["mode"]) == {"wall"}
    assert (rows["time_s"] > 0).all() and (rows["noise"] >= 0).all() and (rows["reps"] >= 3).all()
    for row in rows.itertuples():
        cost = op_cost(row.op, row.phase, TINY, "fp32", row.batch, row.seq_len, row.candidates)
        assert (row.flops, row.bytes) == (cost.flops, cost.bytes)
        assert row.tflops == pytest.approx(cost.flops / row.time_s / 1e12)
    assert not rows.duplicated(KEYS).any()
    run = read_meta(result.out)["runs"][result.run_id]
    assert run["device"]["key"] == rows["device"][0] and run["measured"] == len(rows)
    assert run["device"]["caches"] and run["device"]["torch"] == __import__("torch").__version__


def test_rerun_of_a_complete_sweep_does_nothing(tmp_path):
    first = run_sweep(config(tmp_path), log=lambda *_: None)
    before = first.out.read_bytes()
    messages = []
    second = run_sweep(config(tmp_path), log=messages.append)
    assert second.measured == 0 and second.out.read_bytes() == before
    assert "nothing to do" in messages[0]


def test_parquet_output(tmp_path):
    result = run_sweep(config(tmp_path, out=tmp_path / "s.parquet", ops=("up",)), log=lambda *_: None)
    assert len(pd.read_parquet(result.out)) == 8
    assert (tmp_path / "s.parquet.journal.csv").exists()


def test_configurations_that_do_not_fit_are_skipped_with_the_reason(tmp_path):
    result = run_sweep(config(tmp_path, memory_cap_bytes=2000), log=lambda *_: None)
    rows = pd.read_csv(result.out)
    assert result.skipped == len(rows) - result.measured > 0
    skipped = rows[rows["status"] == "skipped"]
    assert skipped["time_s"].isna().all()
    assert skipped["reason"].str.contains("needs .* GB of memory", regex=True).all()


def test_out_of_memory_while_running_is_a_skip_not_a_crash(tmp_path, monkeypatch):
    def exhausted(self, copies=1, weights=None):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 999999999999 bytes.")

    monkeypatch.setattr(OpBenchmark, "build", exhausted)
    result = run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None)
    rows = pd.read_csv(result.out)
    assert result.skipped == 8 and rows["reason"].str.startswith("out of memory").all()

    def broken(self, copies=1, weights=None):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(OpBenchmark, "build", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # real bugs are not hidden as skips
        run_sweep(config(tmp_path, ops=("qk",)), log=lambda *_: None)


def test_sigkill_midway_then_rerun_gives_every_row_exactly_once(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            dict(
                hidden_size=64,
                intermediate_size=96,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_hidden_layers=1,
                vocab_size=50,
            )
        )
    )
    out = tmp_path / "killed.csv"
    command = [
        sys.executable,
        "-m",
        "profilers.sweep",
        "--device",
        "cpu",
        "--model",
        str(model),
        "--batch",
        "1",
        "2",
        "--seq",
        "8",
        "--candidates",
        "1",
        "4",
        "--budget",
        "0.02",
        "--flush-mb",
        "1",
        "--no-ceilings",
        "--no-progress",
        "--out",
        str(out),
    ]
    expected = len(DEFAULT_OPS) * 2 * (1 + 1 + 2)  # every default op, 2 models, prefill + decode + 2 trees
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and (not out.exists() or out.read_text().count("\n") < 12):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    partial = pd.read_csv(out)
    assert 10 <= len(partial) < expected, "the sweep must have been killed midway"

    assert run(main, command[3:]) == 0  # the rerun (in this process: the kill needed a process of its own)
    rows = pd.read_csv(out)
    assert len(rows) == expected
    assert not rows.duplicated(KEYS).any()
    assert rows["run_id"].nunique() == 2  # rows of both runs, linked to their metadata
    assert set(rows["run_id"]) <= set(read_meta(out)["runs"])
    # each run records the flush it sampled after: the 1 MiB asked for
    assert {run["timer"]["flush_bytes"] for run in read_meta(out)["runs"].values()} == {1 << 20}


def test_a_torn_last_line_is_cut_off(tmp_path):
    result = run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None)
    whole = result.out.read_text()
    with result.out.open("a") as f:
        f.write("cpu-x,tiny,fp32,up,dec")  # a kill in the middle of a write
    journal = Journal(result.out)
    assert result.out.read_text() == whole and len(journal.rows()) == 8


def test_a_file_of_another_format_is_not_appended_to(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(PerfkitError, match="other columns"):
        Journal(other)
    with pytest.raises(PerfkitError, match="use a .csv or .parquet"):
        Journal(tmp_path / "rows.txt")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "cuda"], "no CUDA device is visible"),
        (["--device", "cpu", "--dtype", "int8"], "measured as a ceiling only"),
        (["--device", "cpu", "--ops", "mlp"], "unknown op 'mlp'"),
        (["--device", "cpu", "--out", "x.txt"], "use a .csv or .parquet"),
        (["--device", "cpu", "--model", "llama-8b"], "unknown model"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert run(main, ["--no-ceilings", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_usage_errors_from_the_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "profilers.sweep", "--batch", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2
    assert "argument --batch: must be a positive integer, got '0'" in result.stderr and "Traceback" not in result.stderr


def test_clock_state_is_merged_pessimistically():
    merged = sweeper.worst_state(
        {"sm_clock_mhz": 1980, "temp_c": 60, "throttle": "gpu_idle"},
        {"sm_clock_mhz": 1755, "temp_c": 71, "throttle": "sw_power_cap"},
    )
    assert merged["sm_clock_mhz"] == 1755 and merged["temp_c"] == 71 and merged["throttle"] == "gpu_idle+sw_power_cap"


def test_cpu_key_without_torch_matches_the_full_description():
    from perfmodel.hardware.cpu_identity import cpu_key, this_cpu_key
    from profilers.device import cpu_info

    assert this_cpu_key() == cpu_info().key
    assert cpu_key("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", 8) == "cpu-intel-xeon-gold-6338-8c"


def test_cuda_sweeps_default_to_the_fine_token_grid_and_cpu_sweeps_do_not():
    assert sweeper.sweep_grid("cuda") == PAPER_GRID.with_fine_tokens()
    assert sweeper.sweep_grid("cuda").linear_tokens == fine_token_grid(8192)
    assert sweeper.sweep_grid("cpu") == QUICK_GRID and QUICK_GRID.linear_tokens == ()
    assert sweeper.sweep_grid("cpu", token_grid="fine").linear_tokens == fine_token_grid(512)
    assert sweeper.sweep_grid("cuda", token_grid="coarse") == PAPER_GRID
    narrowed = sweeper.sweep_grid("cuda", "quick", None, [4], [64], [8])
    assert narrowed == Grid((4,), (64,), (8,), fine_token_grid(64))
    with pytest.raises(PerfkitError, match="token grid 'medium': choose from fine, coarse"):
        sweeper.sweep_grid("cpu", token_grid="medium")
    with pytest.raises(PerfkitError, match="grid 'huge': choose from paper, quick"):
        sweeper.sweep_grid("cpu", "huge")
    parser = sweep_command.build_parser()
    assert parser.parse_args([]).token_grid is None  # resolved by device, not fixed by the parser
    cpu = sweep_command.config_from_args(parser.parse_args(["--device", "cpu"]))
    assert cpu.grid == QUICK_GRID and cpu.out.name == "cpu-llama-7b-fp32-quick.csv"
    fine = sweep_command.config_from_args(parser.parse_args(["--device", "cpu", "--token-grid", "fine"]))
    assert fine.grid == QUICK_GRID.with_fine_tokens() and fine.out == cpu.out  # one file: a fine rerun resumes it


def test_the_flush_before_each_sample_is_sized_or_turned_off_on_the_command_line():
    parser = sweep_command.build_parser()
    default = sweep_command.config_from_args(parser.parse_args(["--device", "cpu"])).timer
    assert default.flush_cache and default.flush_bytes is None  # twice the last-level cache
    sized = sweep_command.config_from_args(parser.parse_args(["--device", "cpu", "--flush-mb", "64"])).timer
    assert sized.flush_cache and sized.flush_bytes == 64 << 20
    off = sweep_command.config_from_args(parser.parse_args(["--device", "cpu", "--flush-mb", "0"])).timer
    assert not off.flush_cache


def test_measure_on_a_gpu_takes_the_fine_token_grid(monkeypatch):
    grids = []
    info = SimpleNamespace(key="h100-sxm", spec_key="h100-sxm", name="NVIDIA H100")
    monkeypatch.setattr(sweep_runs, "check_device", lambda device: device)
    monkeypatch.setattr(sweep_runs, "cuda_info", lambda: (info, None))
    monkeypatch.setattr(sweep_runs, "run_sweep", lambda config, log: grids.append(config.grid) or config)
    sweep_runs.measure_and_store("cuda", [TINY], "fp16", QUICK_GRID, log=lambda *_: None)
    sweep_runs.measure_and_store("cuda", [TINY], "fp16", QUICK_GRID, log=lambda *_: None, token_grid="coarse")
    sweep_runs.measure_and_store("cpu", [TINY], "fp32", QUICK_GRID, log=lambda *_: None)
    assert grids == [QUICK_GRID.with_fine_tokens(), QUICK_GRID, QUICK_GRID]


def test_a_fine_cpu_sweep_times_linear_ops_at_every_fine_token_count(tmp_path):
    fine = Grid(batches=(2,), seq_lens=(32,), candidates=(1,)).with_fine_tokens()
    tokens = fine_token_grid(32)
    assert tokens == (1, 2, 4, 8, 16, 24, 32)
    changes = dict(ops=("up", "qk"), phases=("prefill", "decode"))
    coarse = run_sweep(config(tmp_path, grid=fine.with_fine_tokens(False), **changes), log=lambda *_: None)
    assert coarse.measured == 4  # (2, 32) for each op and phase
    messages = []
    result = run_sweep(config(tmp_path, grid=fine, **changes), log=messages.append)
    assert result.measured == len(tokens) and "linear ops at 7 token counts" in messages[0]  # resumes: only new
    rows = pd.read_csv(result.out)
    check_table(rows)
    assert len(rows) == 4 + len(tokens) and not rows.duplicated(KEYS).any() and set(rows["status"]) == {"ok"}
    one = rows[(rows["op"] == "up") & (rows["batch"] == 1)]
    assert set(one["phase"]) == {"prefill"} and set(one["candidates"]) == {1}
    assert sorted(one["seq_len"]) == list(tokens)
    assert (one["flops"] == 2 * one["seq_len"] * TINY.hidden_size * TINY.intermediate_size).all()
    assert len(rows[rows["op"] == "qk"]) == 2  # attention keeps its grid
    assert read_meta(result.out)["runs"][result.run_id]["grid"]["linear_tokens"] == list(tokens)
    assert run_sweep(config(tmp_path, grid=fine, **changes), log=lambda *_: None).measured == 0


def test_token_grid_on_the_command_line(tmp_path, capsys):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_hidden_layers=1, vocab_size=50)
        )
    )
    out = tmp_path / "fine.csv"
    common = ["--device", "cpu", "--model", str(model), "--batch", "1", "--seq", "16", "--ops", "up"]
    options = ["--phases", "prefill", "--budget", "0.02", "--no-ceilings", "--no-progress", "--out", str(out)]
    assert run(main, [*common, *options, "--token-grid", "fine"]) == 0
    assert sorted(pd.read_csv(out)["seq_len"]) == [1, 2, 4, 8, 16]
    assert run(main, [*common, *options, "--token-grid", "coarse", "--out", str(tmp_path / "coarse.csv")]) == 0
    assert list(pd.read_csv(tmp_path / "coarse.csv")["seq_len"]) == [16]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--token-grid", "medium"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--token-grid: invalid choice: 'medium' (choose from 'fine', 'coarse')" in err


def test_interleaved_points_spread_their_rounds_over_the_callers_work():
    from profilers.device import cpu_info

    timed = sweeper.Sweeper(config(Path("unused")), cpu_info())
    points = [("up", "decode", 1, 8, 1), ("sdpa", "tree", 2, 12, 4)]
    extra = []
    timing = timed.interleaved(points, "run", extra_calls=[lambda: extra.append(1)])
    assert timing.sampler.rounds == 0  # built and warmed up, nothing sampled yet
    for _ in range(4):  # four pieces of the caller's work, a quarter of the budget after each
        timing.sample_share(4)
    rounds = timing.sampler.rounds
    assert rounds >= 4  # a round at least after every piece
    rows, (extra_timing,) = timing.finish()
    assert [(r["op"], r["phase"], r["batch"], r["seq_len"], r["candidates"]) for r in rows] == points
    assert all(r["status"] == "ok" and r["reps"] == rounds and r["time_s"] > 0 for r in rows)
    check_table(pd.DataFrame(rows))
    assert extra_timing.reps == rounds and len(extra) == FAST.warmup + rounds
    with pytest.raises(PerfkitError, match="shares must be >= 1, got 0"):
        timing.sample_share(0)


def test_interleaved_points_finish_with_min_reps_when_the_caller_took_no_rounds():
    from profilers.device import cpu_info

    timed = sweeper.Sweeper(config(Path("unused")), cpu_info())
    rows, extra = timed.interleaved([("up", "decode", 1, 8, 1)], "run").finish()
    assert rows[0]["reps"] == FAST.min_reps and extra == []


def test_event_timings_far_above_their_floor_are_retimed_in_a_graph():
    # an H100's ceilings: a 4096 x 4096 fp16 GEMV reads 32 MiB, ~11 us at 3 TB/s
    ceilings = {"device": "h100-sxm", "bandwidth_gb_s": {"copy": 3000.0}, "peak_tflops": {"fp16": 770.0}}
    gemv = OpBenchmark(dataclasses.replace(TINY, hidden_size=4096), "q", "decode", 1, 8, 1, "fp16", "cuda")
    floor = sweeper.floor_seconds(gemv, ceilings)
    cost = op_cost("q", "decode", gemv.model, "fp16", 1, 8, 1)
    assert floor == pytest.approx(cost.bytes / 3000e9)
    assert sweeper.retime_in_graph(30e-6, floor)  # under 50 us
    assert not sweeper.retime_in_graph(60e-6, 1e-3)  # a long kernel near its floor keeps its events
    assert sweeper.retime_in_graph(5e-3, 1e-3)  # 5x its floor: launch gaps, not work
    assert not sweeper.retime_in_graph(5e-3, None)  # no measured ceilings: only the 50 us rule
    assert sweeper.floor_seconds(gemv, None) is None
    # a compute-bound point's floor is its FLOPs at the peak
    prefill = OpBenchmark(gemv.model, "q", "prefill", 8, 2048, 1, "fp16", "cuda")
    big = op_cost("q", "prefill", gemv.model, "fp16", 8, 2048, 1)
    assert sweeper.floor_seconds(prefill, ceilings) == pytest.approx(max(big.bytes / 3000e9, big.flops / 770e12))


def test_a_sweep_without_measured_ceilings_judges_event_timings_by_the_datasheet():
    from profilers.device import DeviceInfo

    # What a GPU check is (no ceilings stage): an H200 whose tree attention took 73-94 us in
    # CUDA events and 15-18 us in a graph (profilers/measurements/h200/gpu-check-2026-11-28).
    h200 = DeviceInfo("cuda", "h200", "NVIDIA H200", "h200", 60 << 20, 141 << 30, 16, {})
    no_flush = config(Path("unused"), timer=dataclasses.replace(FAST, flush_cache=False))  # no CUDA here
    timed = sweeper.Sweeper(no_flush, h200)
    assert timed.floor_ceilings["bandwidth_gb_s"] == {"datasheet": 4800.0}
    tree = OpBenchmark(dataclasses.replace(TINY, hidden_size=4096), "sdpa", "tree", 1, 128, 16, "fp16", "cuda")
    floor = sweeper.floor_seconds(tree, timed.floor_ceilings)
    assert sweeper.retime_in_graph(73e-6, floor)  # over 50 us, but many times its floor
    measured = {"device": "h200", "bandwidth_gb_s": {"copy": 4300.0}, "peak_tflops": {"fp16": 790.0}}
    assert sweeper.Sweeper(no_flush, h200, ceilings=measured).floor_ceilings is measured
    unknown = dataclasses.replace(h200, spec_key=None)
    assert sweeper.Sweeper(no_flush, unknown).floor_ceilings is None  # no datasheet: the 50 us rule


def test_a_sweep_puts_back_the_callers_thread_count(tmp_path):
    # A sweep times a CPU with all its threads; the caller (a notebook, a report's --measure,
    # a test worker sharing two cores) goes on with the count it had.
    before = torch.get_num_threads()
    with torch_threads(1):
        run_sweep(config(tmp_path, ops=("up",)), log=lambda *_: None)
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
