"""Every CUDA code path, on a real GPU (`python -m pytest -m gpu`): the CUDA-event and
CUDA-graph timers, NVML, the ceilings, the CUDA sweep, the campaign, and the decoder with
greedy and rejection-sampling acceptance. Skipped, with the reason, where torch sees no CUDA
device; each test fails on a GPU if the code it covers is wrong."""

from __future__ import annotations

import json
import math
import time

import pandas as pd
import pytest
import torch

from decoder.acceptance import AcceptanceConfig
from decoder.checkpoint import load_checkpoint
from decoder.medusa import Decoder
from decoder.runs import heldout_prompts
from decoder.tree import Drafting, resolve_tree
from perfmodel.cli import run
from perfmodel.hardware.specs import find_spec
from perfmodel.measured.store import measured_rows
from perfmodel.models.grid import Grid
from profilers.campaign import main as campaign_main
from profilers.campaign_plan import TwinStage
from profilers.campaign_variants import TWIN_RECORD, plan_for
from profilers.ceilings import measure_ceilings
from profilers.closed_loop.twin import TwinConfig, twin_loop
from profilers.device import cuda_info, decode_clock_events
from profilers.engine_kernels import main as engine_kernels_main
from profilers.kernel_replay import KernelTimes
from profilers.sweep_runs import run_sweep
from profilers.sweeper import GRAPH_BELOW_S, SweepConfig
from profilers.timer import TimerConfig, cache_flusher, time_cuda_events, time_cuda_graph
from tests.conftest import TINY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch.cuda.is_available() is False"),
]

FAST = TimerConfig(warmup=2, min_reps=5, max_reps=50, budget_s=0.2)


def matmul(n: int, k: int | None = None):
    a = torch.randn(n, k or n, device="cuda", dtype=torch.float16)
    b = torch.randn(k or n, n, device="cuda", dtype=torch.float16)
    out = torch.empty(n, n, device="cuda", dtype=torch.float16)
    return lambda: torch.mm(a, b, out=out)


def wall_per_call(call, calls: int = 20) -> float:
    call()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / calls


# ----------------------------------------------------------------------------- timers


def test_cuda_events_time_a_long_kernel_as_the_wall_clock_does():
    big = matmul(8192)  # ~1 TFLOP: milliseconds on any data-centre GPU, launch costs negligible
    timing = time_cuda_events(big, FAST)
    assert timing.mode == "cuda-events" and timing.reps >= FAST.min_reps
    assert math.isfinite(timing.median_s) and timing.median_s > 0 and timing.noise < 0.1
    assert 0.8 < timing.median_s / wall_per_call(big) < 1.25
    double = time_cuda_events(matmul(8192, 16384), FAST)  # twice the work
    assert 1.6 < double.median_s / timing.median_s < 2.5


def test_cuda_events_flush_l2_outside_the_timed_region():
    info, _ = cuda_info()
    flush = cache_flusher("cuda", info.cache_bytes)
    flush_alone = time_cuda_events(flush, FAST)  # a memset of twice L2: tens of microseconds
    small = matmul(512)  # a few microseconds
    cold = time_cuda_events(small, FAST, flush)
    assert 0 < cold.median_s < flush_alone.median_s  # were the flush timed, it would be the larger


def test_a_cuda_graph_times_each_call_and_replays_every_copy():
    counter = torch.zeros((), device="cuda")
    x = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    out = torch.empty_like(x)

    def call():
        torch.mm(x, x, out=out)
        counter.add_(1)

    one = time_cuda_graph([call], FAST)
    counter.zero_()
    sixteen = time_cuda_graph([call] * 16, FAST)
    assert one.mode == sixteen.mode == "cuda-graph"
    assert 0 < sixteen.median_s < GRAPH_BELOW_S and math.isfinite(one.median_s)
    # per call, not per replay of 16; a one-call graph also pays the replay's launch, which
    # 16 calls share (H100: 10.9 us a one-call replay, 4.1 us a call in sixteen)
    assert one.median_s / 16 < sixteen.median_s < 2 * one.median_s
    # warm-up off the capture stream, one replay after capture, then one replay per sample
    assert counter.item() == 16 * (max(1, FAST.warmup) + 1 + sixteen.reps)
    events = time_cuda_events(call, FAST)
    assert sixteen.median_s < 1.5 * events.median_s  # no launch gap between replayed calls


# ----------------------------------------------------------------------------- NVML and ceilings


def test_nvml_names_this_gpu_and_reads_its_state():
    info, nvml = cuda_info()
    props = torch.cuda.get_device_properties(0)
    assert nvml is not None, info.details.get("nvml_error")
    identity = nvml.identity()
    assert identity["name"] == info.name == torch.cuda.get_device_name(0)
    assert identity["uuid"] == f"GPU-{props.uuid}" and identity["driver"]
    assert identity["max_sm_clock_mhz"] > 0 and identity["power_limit_w"] > 0
    assert info.memory_bytes == props.total_memory and info.details["sm_count"] == props.multi_processor_count
    assert info.details["compute_capability"] == f"{props.major}.{props.minor}" and info.details["cuda"]
    state = nvml.state()
    assert 0 < state["sm_clock_mhz"] <= identity["max_sm_clock_mhz"] and state["mem_clock_mhz"] > 0
    assert 0 < state["power_w"] and 10 <= state["temp_c"] <= 110
    assert isinstance(state["throttle"], str) and decode_clock_events(0) == ""
    for model, key in (("H100", "h100"), ("H200", "h200"), ("A100", "a100")):
        if model in info.name:
            assert info.spec_key and info.spec_key.startswith(key), info.name


def test_measured_ceilings_lie_below_the_datasheet():
    info, _ = cuda_info()
    ceilings = measure_ceilings(info, ("fp16",), log=lambda *_: None)
    assert set(ceilings.bandwidth_gb_s) == {"copy", "triad", "read"} and ceilings.peak_tflops["fp16"] > 0
    assert 0.5 < ceilings.kernel_overhead_us < 100
    if info.spec_key:
        spec = find_spec(info.spec_key)
        assert 0.3 < max(ceilings.bandwidth_gb_s.values()) / spec.memory_bandwidth_gb_s < 1.1
        assert 0.2 < ceilings.peak_tflops["fp16"] / spec.peak_tflops["fp16"] < 1.1


# ----------------------------------------------------------------------------- the CUDA sweep and the campaign


def test_the_cuda_sweep_times_every_point_and_records_the_gpu_state(tmp_path):
    grid = Grid(batches=(1, 2), seq_lens=(64,), candidates=(1, 4))
    base = dict(ops=("up", "qk", "sdpa"), timer=FAST, ceilings=False, progress=False)
    auto = run_sweep(SweepConfig("cuda", TINY, "fp16", grid, tmp_path / "auto.csv", **base), log=lambda *_: None)
    rows = pd.read_csv(auto.out)
    assert len(rows) == auto.measured == 3 * (2 + 2 + 4) and set(rows["status"]) == {"ok"}
    assert (rows["time_s"] > 0).all() and rows["time_s"].map(math.isfinite).all()
    # Under 50 us a point is timed again in a CUDA graph: the tiny model's ops mostly are.
    assert "cuda-graph" in set(rows["mode"]) and set(rows["mode"]) <= {"cuda-graph", "cuda-events"}
    assert (rows.loc[rows["mode"] == "cuda-events", "time_s"] >= GRAPH_BELOW_S).all()
    assert (rows["sm_clock_mhz"] > 0).all() and (rows["temp_c"] > 0).all()
    events = SweepConfig("cuda", TINY, "fp16", grid, tmp_path / "events.csv", timer_mode="events", **base)
    assert set(pd.read_csv(run_sweep(events, log=lambda *_: None).out)["mode"]) == {"cuda-events"}
    messages = []
    assert run_sweep(SweepConfig("cuda", TINY, "fp16", grid, auto.out, **base), log=messages.append).measured == 0
    assert "nothing to do" in messages[0]


def test_the_quick_cuda_campaign_writes_data_contract_files(tmp_path, capsys):
    argv = ["--device", "cuda", "--quick", "--out", str(tmp_path), "--no-progress"]
    assert run(campaign_main, argv) == 0
    info, _ = cuda_info()
    folder = tmp_path / info.key
    record = json.loads((folder / "ceilings.json").read_text())
    assert set(record["ceilings"]["bandwidth_gb_s"]) == {"copy", "triad", "read"}
    assert record["device"]["uuid"] and record["state"]["sm_clock_mhz"] > 0
    manifest = json.loads((folder / "campaign.json").read_text())
    assert manifest["versions"]["cuda"] == torch.version.cuda and manifest["versions"]["driver"]
    assert all(stage["status"] == "done" for stage in manifest["stages"])
    for stage in plan_for("cuda", "quick").stages[1:]:
        if isinstance(stage, TwinStage):  # its own tables, measured beside predicted steps
            table = pd.read_csv(folder / stage.out)
            assert len(table) == stage.size() and (table["measured_step_s"] > 0).all()
            assert table["predicted_step_s"].notna().all()
            continue
        rows = measured_rows(folder / stage.out, device=info.key)
        assert len(rows) == stage.size() and (rows["time_s"] > 0).all(), stage.name
        assert set(rows["mode"]) <= {"cuda-events", "cuda-graph"}
    capsys.readouterr()
    assert run(campaign_main, argv) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_the_twin_closed_loop_runs_on_cuda_with_every_kernel_replayed():
    config = TwinConfig(
        model="bundled",
        replay=TWIN_RECORD,
        sizes=(4, 16),
        dtype="fp16",
        device="cuda",
        prompts=2,
        prompt_len=32,
        new_tokens=16,
        rounds=1,
    )
    table, classes, summary = twin_loop(config, log=lambda text: None)
    assert list(table["tree_size"]) == [1, 4, 16]
    assert (table["measured_step_s"] > 0).all() and table["error"].map(math.isfinite).all()
    assert summary["calls_not_replayed"] == 0 and summary["in_step_factor"] > 0
    gpu_kernels = classes[(classes["kernel_class"] == "gemm") & (classes["tree_size"] == 16)]
    assert gpu_kernels["measured_s"].iloc[0] > 0  # the profiler saw the GEMMs' CUDA kernels
    # and the tree's attention kernels, which run inside SDPA's backend operator
    attention = classes[(classes["kernel_class"] == "attention") & (classes["tree_size"] == 16)]
    assert attention["measured_s"].iloc[0] > 0


def test_kernel_replay_times_a_gemm_call_by_cuda_events():
    call = (
        '["aten.mm.default",[{"t":[16,4096],"s":[4096,1],"d":"float16"},'
        '{"t":[4096,4096],"s":[1,4096],"d":"float16","w":1}],{}]'
    )
    kernels = KernelTimes.of([pd.DataFrame({"call": [call]})], "cuda", cuda_info()[0].cache_bytes)
    (seconds,) = kernels.times().values()
    # a 32 MB weight streamed cold: at least its bytes at twice any GPU's bandwidth, under a millisecond
    assert 32e6 / 10e12 < seconds < 1e-3


# ----------------------------------------------------------------------------- the decoder on CUDA


@pytest.fixture(scope="module")
def decoders():
    ckpt = load_checkpoint("bundled")
    prompts = heldout_prompts(ckpt, 2, 16, seed=0)
    return ckpt, Decoder(ckpt), Decoder(load_checkpoint("bundled"), device="cuda"), prompts


def test_greedy_decoding_on_cuda_gives_the_cpus_tokens(decoders):
    ckpt, cpu, cuda, prompts = decoders
    plain = cpu.generate(prompts, 16)
    assert cuda.generate(prompts, 16).tokens == plain.tokens
    tree = cuda.generate(prompts, 16, drafting=Drafting(resolve_tree("mc-sim-7b-63", ckpt)))
    assert tree.tokens == plain.tokens  # greedy Medusa is lossless on CUDA too
    assert tree.steps < plain.steps


def test_rejection_sampling_on_cuda_draws_what_the_cpu_draws(decoders):
    ckpt, cpu, cuda, prompts = decoders
    tree = resolve_tree("mc-sim-7b-63", ckpt)
    sampling = AcceptanceConfig("rejection", temperature=1.0, seed=5)
    on_cuda = cuda.generate(prompts, 16, drafting=Drafting(tree), acceptance=sampling)
    assert [len(t) for t in on_cuda.tokens] == [16, 16]
    assert all(0 <= t < ckpt.model.config.vocab_size for seq in on_cuda.tokens for t in seq)
    # One random stream on the CPU whatever the device: the same seed draws the same tokens.
    assert on_cuda.tokens == cpu.generate(prompts, 16, drafting=Drafting(tree), acceptance=sampling).tokens
    # At a temperature near zero the model's distribution is its argmax: rejection sampling is greedy.
    cold = AcceptanceConfig("rejection", temperature=1e-4, seed=5)
    assert (
        cuda.generate(prompts, 16, drafting=Drafting(tree), acceptance=cold).tokens == cpu.generate(prompts, 16).tokens
    )


def test_the_engine_kernels_are_timed_in_graphs_beside_their_predictions(tmp_path, capsys):
    out = tmp_path / "engine-kernels.csv"
    assert run(engine_kernels_main, ["--csv", str(out)]) == 0
    rows = pd.read_csv(out)
    assert set(rows["kernel"]) == {"lm_head", "add_norm_eager", "add_norm_compiled"}
    assert (rows["time_s"] > 0).all() and rows["driver"].notna().all()
    head = rows[rows["kernel"] == "lm_head"].set_index(["split", "m"])["time_s"]
    spec = find_spec(cuda_info()[0].name)
    floor = 4096 * 128256 * 2 / spec.bandwidth  # the whole head's weight at the datasheet bandwidth
    assert head.loc[(1, 1)] > 0.95 * floor and head.loc[(8, 1)] < head.loc[(1, 1)] / 3
    compiled, eager = (rows[rows["kernel"] == k]["time_s"].to_numpy() for k in ("add_norm_compiled", "add_norm_eager"))
    assert (compiled < eager).all()  # one fused kernel against torch's op-by-op chain


def test_the_static_step_from_a_cuda_graph_is_lossless_and_samples(decoders):
    ckpt, cpu, cuda, prompts = decoders
    plain = cpu.generate(prompts, 16)
    tree = resolve_tree("mc-sim-7b-63", ckpt)
    for launch in ("static", "graph"):
        assert cuda.generate(prompts, 16, launch=launch).tokens == plain.tokens
        medusa = cuda.generate(prompts, 16, drafting=Drafting(tree), launch=launch)
        assert medusa.tokens == plain.tokens and medusa.steps < plain.steps
    assert (
        cuda.generate(prompts, 16, drafting=Drafting(tree), launch="graph").tokens == plain.tokens
    )  # the captured graph replayed
    sampled = cuda.generate(
        prompts, 16, drafting=Drafting(tree), launch="graph", acceptance=AcceptanceConfig("rejection", 1.0)
    )
    assert [len(t) for t in sampled.tokens] == [16, 16]
    assert all(0 <= t < ckpt.model.config.vocab_size for seq in sampled.tokens for t in seq)
    cold = AcceptanceConfig("rejection", temperature=1e-4, seed=5)
    assert cuda.generate(prompts, 16, drafting=Drafting(tree), launch="graph", acceptance=cold).tokens == plain.tokens
