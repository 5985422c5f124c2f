"""Timing all-reduce across processes with torch.distributed: gloo on a CPU, NCCL on GPUs.

`run_ranks` spawns one process per rank (torch.multiprocessing, rendezvous through a file
store in a temporary folder: no port to pick or collide on) and times, for each message
size, an all_reduce (sum) of that many bytes per rank:

- a few warm-up calls of every size first (the backend sets up its buffers and connections
  on first use);
- then samples, each after a barrier: `calls_per_sample` back-to-back calls (as nccl-tests
  and a decoding step issue them), so the skew with which ranks leave the barrier is spread
  over them instead of inflating a single small call; a CPU sample is the wall clock
  (perf_counter), a GPU sample CUDA events around the calls, synchronized;
- each sample is the slowest rank's time per call (an all-reduce ends for a step when it
  ends on every rank); the row gets the median of the samples and their IQR/median;
- samples are taken in rounds, one of every size per round in a shuffled order (the same
  on every rank), as profilers.timer.InterleavedSampler takes them: loopback gloo on a
  virtual machine drifts between a fast and a slow mode over seconds (2x apart on 2
  cores), and sizes timed one after another would each get their own mode, a curve that
  is not even monotone; in turn every size sees the same mixture;
- rounds go on to timer.min_reps, then until every size's IQR/median <= target_noise, the
  budget (budget_s per size) or max_reps, every decision made on the samples reduced over
  the ranks, so every rank takes the same number (a rank that stopped early would leave
  the others waiting in an all-reduce forever). The budget counts the sampled calls' time,
  the same on every rank, not each rank's own clock.

Rank 0 sends the samples to the parent at the end, which writes a row per size
(profilers.allreduce): a rerun measures only the sizes a file lacks.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import writable_file
from perfmodel.measured.collectives import BACKEND_COLUMN, OP, PHASE
from perfmodel.measured.contract import ContractPoint, contract_fields
from perfmodel.models.operators import OpCost
from profilers.device import DeviceInfo, cpu_state
from profilers.store import Journal, output_lock, record_run
from profilers.sweep_runs import new_run_id
from profilers.timer import TimerConfig, Timing, summarize

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
KiB, MiB = 1024, 1024**2
# 4 KiB to 64 MiB in powers of two: one decoding token of a 7B model in fp16 (8 KiB) to a
# few hundred tree tokens x batch at hidden 8192 (perfmodel.latency.allreduce.DECODE_BYTES).
DEFAULT_SIZES = tuple(4 * KiB << i for i in range(15))
QUICK_SIZES = (4 * KiB, 256 * KiB, 16 * MiB)
MAX_SIZE = 4 * 1024**3  # per rank; every rank holds a tensor of every size at once
# A sample's calls run back to back until about this many bytes are reduced in it (16 calls
# at most): enough calls to spread a barrier's skew, few enough to keep a round short.
SAMPLE_BYTES = 1 * MiB
MAX_CALLS = 16


# Loopback gloo on a small virtual machine is noisy (IQR/median 20-300% seen on 2 cores):
# many rounds, a loose target, and a budget per size that keeps a default CPU run near half
# a minute. flush_cache is not used: messages are reduced from where they lie, as in a step.
DEFAULT_TIMER = TimerConfig(warmup=3, min_reps=10, max_reps=400, target_noise=0.05, budget_s=2.0)
QUICK_TIMER = TimerConfig(warmup=1, min_reps=5, max_reps=5, budget_s=0.0)


@dataclass(frozen=True)
class CollectiveConfig:
    device: str  # cpu or cuda
    ranks: int
    dtype: str
    sizes: tuple[int, ...]  # message bytes per rank, ascending
    timer: TimerConfig = DEFAULT_TIMER
    threads: int = 1  # torch threads per rank (a CPU's cores shared out between its ranks)

    @property
    def backend(self) -> str:
        return BACKENDS[self.device]

    @property
    def mode(self) -> str:
        return "cuda-events" if self.device == "cuda" else "wall"


def calls_per_sample(nbytes: int) -> int:
    return max(1, min(MAX_CALLS, SAMPLE_BYTES // nbytes))


def check_sizes(sizes, dtype: str) -> tuple[int, ...]:
    """Message sizes as a sorted tuple of bytes: each a whole number of `dtype` elements,
    from one element to MAX_SIZE."""
    size = element_bytes(dtype)
    for nbytes in sizes:
        if nbytes < size or nbytes % size or nbytes > MAX_SIZE:
            raise PerfkitError(
                f"message size {nbytes} B: must be a multiple of {dtype}'s {size} B per element, from {size} B to "
                f"{MAX_SIZE // 1024**3} GiB"
            )
    return tuple(sorted(set(sizes)))


@dataclass(frozen=True)
class SizeTiming:
    """One message size: every sample's slowest-rank seconds per call."""

    nbytes: int
    calls: int
    samples: tuple[float, ...]

    def timing(self, mode: str) -> Timing:
        return summarize(self.samples, mode)


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def contract_row(info: DeviceInfo, config: CollectiveConfig, result: SizeTiming, run_id: str) -> dict:
    """The data-contract row of one size (perfmodel.measured.collectives says what each field
    holds), with the journal's columns and the backend."""
    timing = result.timing(config.mode)
    elements = result.nbytes // element_bytes(config.dtype)
    fields = contract_fields(
        ContractPoint(info.key, "", config.dtype, OP, PHASE, batch=config.ranks, seq_len=elements),
        cost=OpCost(flops=0, bytes=result.nbytes, kernels=0),
        time_s=timing.median_s,
        source="measured",
        noise=timing.noise,
        run_id=run_id,
    )
    extra = {"status": "ok", "reason": "", "mode": config.mode, "reps": timing.reps * result.calls}
    blank = dict.fromkeys(("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "throttle"))
    state = cpu_state() if config.device == "cpu" else {"cpu_mhz": None}
    return {**fields, **extra, "threads": config.threads, **blank, **state, BACKEND_COLUMN: config.backend}


def run_ranks(config: CollectiveConfig, on_result: Callable[[SizeTiming], None], poll_s: float = 0.2) -> None:
    """Time every size of `config` over config.ranks processes, then call `on_result` in this
    process with each size's timing. A rank that fails is a one-line PerfkitError naming it
    and its error (the others are stopped)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="perfkit-allreduce-") as folder:
        store = os.path.join(folder, "rendezvous")
        ranks = mp.start_processes(
            _rank_main, (config, store, results), nprocs=config.ranks, join=False, start_method="spawn"
        )
        try:
            done = False
            while not done:
                done = ranks.join(timeout=poll_s)
                while not results.empty():
                    on_result(results.get())
        except mp.ProcessRaisedException as exc:
            last = [line for line in str(exc).splitlines() if line.strip()][-1]
            raise PerfkitError(f"all-reduce rank {exc.error_index} failed: {last}") from None
        except mp.ProcessExitedException as exc:
            raise PerfkitError(f"all-reduce rank {exc.error_index} ended: {exc}") from None
        finally:
            for process in ranks.processes:
                if process.is_alive():
                    process.kill()


def _rank_main(rank: int, config: CollectiveConfig, store: str, results) -> None:
    """One rank: join the group, time every size, send rank 0's results to the parent."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(config.threads)
    if config.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(config.backend, init_method=f"file://{store}", rank=rank, world_size=config.ranks)
    try:
        timings = _time_sizes(config, rank)
        if rank == 0:
            for timing in timings:
                results.put(timing)
    finally:
        dist.destroy_process_group()


def keep_sampling(samples: list[list[float]], calls: list[int], timer: TimerConfig) -> bool:
    """Whether to take another round, from the samples so far (the same on every rank)."""
    rounds = len(samples[0])
    if rounds < timer.min_reps:
        return True
    spent = sum(sum(s) * c for s, c in zip(samples, calls))
    settled = all(summarize(s, "wall").noise <= timer.target_noise for s in samples)
    return not settled and rounds < timer.max_reps and spent < timer.budget_s * len(samples)


def _time_sizes(config: CollectiveConfig, rank: int) -> list[SizeTiming]:
    import numpy as np
    import torch
    import torch.distributed as dist

    from profilers.benchmarks import torch_dtype

    device = torch.device("cuda", rank) if config.device == "cuda" else torch.device("cpu")
    # Zeros: a sum of zeros stays zero, never reaching inf or denormals that could change the time.
    tensors = [
        torch.zeros(n // element_bytes(config.dtype), dtype=torch_dtype(config.dtype), device=device)
        for n in config.sizes
    ]
    calls = [calls_per_sample(n) for n in config.sizes]
    barrier = (lambda: dist.barrier(device_ids=[rank])) if config.device == "cuda" else dist.barrier
    for x in tensors:
        for _ in range(config.timer.warmup):
            dist.all_reduce(x)
    order = np.random.default_rng(0)  # one seed: every rank shuffles alike
    samples: list[list[float]] = [[] for _ in config.sizes]
    while keep_sampling(samples, calls, config.timer):
        mine = [0.0] * len(tensors)
        for i in order.permutation(len(tensors)):
            mine[i] = _sample(tensors[i], calls[i], barrier, config.device)
        slowest = torch.tensor(mine, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        for kept, value in zip(samples, slowest.cpu().tolist()):
            kept.append(value)
    return [SizeTiming(n, c, tuple(s)) for n, c, s in zip(config.sizes, calls, samples)]


def _sample(x, calls: int, barrier, device: str) -> float:
    """Seconds per call of `calls` back-to-back all-reduces of x on this rank."""
    import torch
    import torch.distributed as dist

    barrier()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    started = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter() - started) / calls


def default_threads(device: str, ranks: int) -> int:
    """A CPU's cores shared out between its ranks, so ranks do not fight over them."""
    return max(1, (os.cpu_count() or 1) // ranks) if device == "cpu" else 1


# --- a run into a file ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    out: Path
    measured: list[SizeTiming]
    total_rows: int
    run_id: str | None


def done_sizes(rows, device_key: str, config: CollectiveConfig) -> set[int]:
    """The message sizes a file holds already for this device, backend, dtype and rank count."""
    if rows.empty:
        return set()
    mine = rows[
        (rows["device"].astype(str) == device_key)
        & (rows["op"] == OP)
        & (rows["dtype"] == config.dtype)
        & (rows[BACKEND_COLUMN].astype(str) == config.backend)
        & (rows["batch"].astype(int) == config.ranks)
        & (rows["status"].fillna("ok") == "ok")
    ]
    return {int(b) for b in mine["bytes"]}


def run_metadata(config: CollectiveConfig, info: DeviceInfo, sizes: tuple[int, ...], started: float) -> dict:
    meta = {
        "device": info.as_dict(),
        "command": "profilers.allreduce",
        "backend": config.backend,
        "ranks": config.ranks,
        "dtype": config.dtype,
        "sizes": list(sizes),
        "timer": asdict(config.timer),
        "calls_per_sample": f"max(1, min({MAX_CALLS}, {SAMPLE_BYTES} // bytes))",
        "sample": "the slowest rank's seconds per call; the row: median and IQR/median over the samples",
        "timer_mode": config.mode,
        "threads_per_rank": config.threads,
        "started": started,
    }
    if config.device == "cuda":
        import torch

        version = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
        meta["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return meta


def measure_into(config: CollectiveConfig, info: DeviceInfo, out: Path, log=print) -> RunResult:
    """Time what `out` lacks of config.sizes (all of them together, in rounds) and append a
    row per size, holding the file's lock: a rerun measures only the sizes missing, a
    complete file nothing. The run's metadata (FILE.meta.json) is recorded before timing."""
    out = Path(out)
    if out.suffix != ".csv":
        raise PerfkitError(f"--out {out}: use a .csv file name (the planner reads <device>/allreduce/*.csv)")
    writable_file(out, "all-reduce output")
    with output_lock(out):
        journal = Journal(out, extra_columns=(BACKEND_COLUMN,))
        done = done_sizes(journal.rows(), info.key, config)
        todo = tuple(s for s in config.sizes if s not in done)
        if not todo:
            log(f"nothing to do: all {len(config.sizes)} sizes are in {out}")
            return RunResult(out, [], len(journal.rows()), None)
        run_id = new_run_id()
        meta = run_metadata(config, info, todo, time.time())
        record_run(out, run_id, meta)
        log(
            f"{info.name} ({info.key}): {config.backend} all_reduce of {config.dtype} over {config.ranks} ranks, "
            f"{len(todo)} of {len(config.sizes)} sizes ({size_text(todo[0])}-{size_text(todo[-1])}) to measure, "
            f"run {run_id} (up to {config.timer.budget_s * len(todo):.0f} s of sampled calls)"
        )
        measured: list[SizeTiming] = []

        def keep(result: SizeTiming) -> None:
            journal.append(contract_row(info, config, result, run_id))
            measured.append(result)
            timing = result.timing(config.mode)
            log(
                f"  {size_text(result.nbytes):>8}: {timing.median_s * 1e6:10.1f} us  (noise {timing.noise:.1%}, "
                f"{timing.reps} samples of {result.calls} calls)"
            )

        run_ranks(replace(config, sizes=todo), keep)
        record_run(out, run_id, {**meta, "finished": time.time(), "measured": len(measured)})
        return RunResult(out, measured, len(journal.rows()), run_id)
