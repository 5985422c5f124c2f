"""The campaign's GEMM grid: single GEMMs (m x k) @ (k x n) timed by the sweeper, as
data-contract rows with op `gemm` and the weight's n and k (profilers.campaign_plan says
which shapes and why).

Each GEMM is the sweep's own linear-op benchmark (profilers.benchmarks: a (k, n) weight
stored as nn.Linear stores it, torch.mm into a preallocated output) on a shape no single
model names, timed by profilers.sweeper.Sweeper (CUDA events, a CUDA graph below 50 us or far above
the roofline floor, out-of-memory recorded as a skip) into a journal that resumes as a sweep's does.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from perfmodel.base.outputs import writable_file
from perfmodel.measured.contract import ContractPoint, contract_fields
from perfmodel.models.grid import Grid
from perfmodel.models.operators import Matmul, cost_of
from profilers.benchmarks import OpBenchmark
from profilers.campaign_plan import GemmStage, Plan
from profilers.device import DeviceInfo
from profilers.store import Journal, output_lock, record_run
from profilers.sweep_runs import new_run_id, progress_bar, torch_set_up
from profilers.sweeper import SweepConfig, Sweeper, worst_state

OP, PHASE = "gemm", "prefill"
SHAPE_COLUMNS = ("n", "k")


@dataclass(frozen=True)
class GemmBenchmark(OpBenchmark):
    """One GEMM of the grid: seq_len is its m (token rows), batch and candidates 1, and no
    model (`model` None: a grid shape belongs to every model that has it)."""

    k: int = 0
    n: int = 0

    @property
    def kernels(self) -> tuple[Matmul, ...]:
        return (Matmul(1, self.seq_len, self.k, self.n, weight=True),)


def gemm_label(k: int, n: int) -> str:
    """The `model` column of a grid row: the shape, so every row's contract key is its own."""
    return f"gemm-k{k}-n{n}"


@dataclass
class GemmResult:
    out: Path
    measured: int
    skipped: int
    total_rows: int


def open_journal(out: Path) -> Journal:
    return Journal(out, extra_columns=SHAPE_COLUMNS)


def row_key(device_key: str, dtype: str, k: int, n: int, m: int) -> tuple:
    return (device_key, gemm_label(k, n), dtype, OP, PHASE, 1, m, 1, n, k)


def missing_gemms(stage: GemmStage, out: Path, device_key: str, dtype: str) -> list[tuple[int, int, int]]:
    """(k, n, m) of the stage that `out` lacks: all of them while it does not exist."""
    if not out.exists():
        return stage.points
    journal = open_journal(out)
    return [(k, n, m) for k, n, m in stage.points if not journal.has(row_key(device_key, dtype, k, n, m))]


def gemm_row(sweeper: Sweeper, bench: GemmBenchmark, timing, reason: str, run_id: str, state: dict) -> dict:
    cost = cost_of(bench.kernels, bench.dtype)
    row = contract_fields(
        ContractPoint(sweeper.info.key, gemm_label(bench.k, bench.n), bench.dtype, OP, PHASE, 1, bench.seq_len),
        cost,
        timing.median_s if timing else None,
        "measured",
        timing.noise if timing else None,
        run_id,
    )
    return {**sweeper.with_timing(row, timing, reason, state), "n": bench.n, "k": bench.k}


def run_gemm_grid(
    stage: GemmStage,
    out: Path,
    info: DeviceInfo,
    nvml,
    plan: Plan,
    ceilings: dict | None,
    log=print,
    progress: bool = True,
) -> GemmResult:
    """Time what `out` lacks of the stage's GEMMs, shape by shape (a shape's weight is made
    once), each row appended as soon as it is measured; the file's lock held throughout.
    The grid is timed in the plan's dtype with its timer."""
    dtype, timer = plan.dtype, plan.timer
    writable_file(out, "GEMM grid output")
    with output_lock(out), torch_set_up(info.kind):
        journal = open_journal(out)
        todo = [(k, n, m) for k, n, m in stage.points if not journal.has(row_key(info.key, dtype, k, n, m))]
        if not todo:
            log(f"nothing to do: all {stage.size()} GEMMs are in {out}")
            return GemmResult(out, 0, 0, len(journal.rows()))
        run_id = new_run_id()
        log(f"{info.name} ({info.key}) {dtype}: {len(todo)} of {stage.size()} GEMMs to measure, run {run_id}")
        grid = Grid((1,), tuple(sorted(set(stage.tokens))), (1,))
        config = SweepConfig(info.kind, None, dtype, grid, out, (OP,), (PHASE,), timer, ceilings=False)
        meta = {
            "device": info.as_dict(),
            "dtype": dtype,
            "shapes": {gemm_label(k, n): ops for (k, n), ops in stage.sources.items()},
            "tokens": list(stage.tokens),
            "timer": asdict(timer),
            "timer_mode": config.timer_mode,
            "ceilings": ceilings,
        }
        meta["started"] = time.time()
        record_run(out, run_id, meta)
        sweeper = Sweeper(config, info, nvml, ceilings)
        measured = skipped = 0
        bar = progress_bar(len(todo), progress)
        shape = None
        for k, n, m in todo:
            if (k, n) != shape:
                sweeper.weights.clear()  # free the previous shape's weight
                shape = (k, n)
            bar.set_description(f"gemm k={k} n={n} m={m}")
            bench = GemmBenchmark(None, OP, PHASE, 1, m, 1, dtype, info.kind, k=k, n=n)
            before = sweeper.state()
            timing, reason = sweeper.time(bench)
            row = gemm_row(sweeper, bench, timing, reason, run_id, worst_state(before, sweeper.state()))
            journal.append(row)
            measured += row["status"] == "ok"
            skipped += row["status"] != "ok"
            bar.update()
        bar.close()
        record_run(out, run_id, {**meta, "finished": time.time(), "measured": measured, "skipped": skipped})
        return GemmResult(out, measured, skipped, len(journal.rows()))
