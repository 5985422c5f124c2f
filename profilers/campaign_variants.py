"""What each campaign variant measures, built into its plan (profilers.campaign_plan):
`full` (what a lent GPU measures; a CPU's short defaults), `quick` (every stage of the full
plan in small, a proof the campaign runs) and `gpu-check` (the short check of a lease of
minutes): the models, grids, GEMM shapes and twins of each, on a CPU or a GPU."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.latency.roofline_table import DEFAULT_MODELS
from perfmodel.models.config import PRESETS, ModelConfig, load_model
from perfmodel.models.grid import PAPER_GRID, QUICK_GRID, Grid, fine_token_grid
from perfmodel.models.operators import ATTENTION_OPS, FUSED_OPS, LINEAR_OPS, PHASES, Matmul, op_kernels
from profilers.benchmarks import check_bench_dtype
from profilers.campaign_plan import (
    TP_DEGREES,
    CeilingsStage,
    GemmStage,
    HostDispatchStage,
    Plan,
    Stage,
    SweepStage,
    TwinStage,
)
from profilers.ceilings import CEILING_TIMER
from profilers.sweeper import default_timer
from profilers.timer import TimerConfig

VARIANTS = ("full", "quick", "gpu-check")
# Attention as the paper times it (QK^T and PV as batched matmuls) and as one fused kernel
# with the causal (prefill) or tree mask.
ATTENTION = (*ATTENTION_OPS, *FUSED_OPS)
# The GEMM grid's token counts on a GPU: 1, 2, 4, every 8 to 512, then 1024, 2048 and 4096 (the
# staircase region, then powers of two; a step of up to 64 requests of a 64-token tree).
GEMM_TOKENS_UP_TO = 4096
# The quick variant: the bundled model (shapes of a few hundred), a handful of points per op, a
# timer that takes a few samples; a proof the campaign runs, not data to commit.
QUICK_MODEL = "bundled"
QUICK_TOKENS = (1, 8, 64)
QUICK_TIMER = TimerConfig(warmup=1, min_reps=3, max_reps=10, budget_s=0.02)
# Two samples per ceiling. On a CPU the quick variant leaves the bandwidth out: its arrays, eight
# times the last-level cache, take tens of seconds to allocate on a small virtual machine.
QUICK_CEILING_TIMER = TimerConfig(warmup=0, min_reps=2, max_reps=2, budget_s=0.0, flush_cache=False)
# The twin: the shipped configs and the bundled model's greedy record, whose accepted path
# lengths (trees of 2-64 tokens) every tree replays.
REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "decoder" / "assets" / "configs"
TWIN_RECORD = (
    REPO / "profilers" / "measurements" / "cpu-intel-xeon-processor-2c" / "twin" / "bundled-greedy-record.json"
)
TWIN_SIZES = (4, 16, 64)


@dataclass(frozen=True)
class TwinTiming:
    """How a twin stage runs and times its steps: the launch regime, the kernel-class profile, the rounds."""

    launch: Launch = Launch.EAGER
    profile: bool = True
    rounds: int = 1


def twin_stage(
    model: str,
    dtype: str,
    batches: tuple[int, ...],
    prompts: int,
    new_tokens: int = 32,
    sizes: tuple[int, ...] | None = None,
    timing: TwinTiming = TwinTiming(),
) -> TwinStage:
    """The twin of `model` (a folder of decoder/assets/configs, or `bundled`); a launch
    regime other than eager in files and a stage name of its own."""
    path = "bundled" if model == "bundled" else str(CONFIGS / model)
    default_sizes, prompt_len = ((4,), 16) if model == "bundled" else (TWIN_SIZES, 128)
    regime = "" if timing.launch is Launch.EAGER else f"-{timing.launch}"
    return TwinStage(
        f"twin-{model}{regime}",
        path,
        str(TWIN_RECORD),
        batches,
        sizes or default_sizes,
        prompts,
        prompt_len,
        new_tokens,
        f"twin/{model}-{dtype}{regime}.csv",
        timing.launch,
        timing.profile,
        timing.rounds,
    )


def gemm_shapes(models, degrees=TP_DEGREES) -> dict[tuple[int, int], list[str]]:
    """(k, n) of every linear op's weight of each model at each tensor-parallel degree that
    splits it, with the ops that have it (e.g. 'llama-7b@tp2:q'), sorted by shape."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for model in models:
        for tp in degrees:
            if tp not in model.tensor_parallel_degrees(max(degrees)):
                continue
            shard = model.shard(tp)
            for op in LINEAR_OPS:
                (matmul,) = op_kernels(op, "prefill", shard, 1, 1, 1)
                assert isinstance(matmul, Matmul) and matmul.weight
                shapes.setdefault((int(matmul.k), int(matmul.n)), []).append(f"{shard.name}:{op}")
    return dict(sorted(shapes.items()))


def gemm_stage(models, tokens: tuple[int, ...], dtype: str, degrees=TP_DEGREES) -> GemmStage:
    shapes = gemm_shapes(models, degrees)
    names = tuple(m.name for m in models)
    return GemmStage("gemm-grid", tuple(shapes), tokens, f"gemm/gemm-{dtype}.csv", names, tuple(degrees), shapes)


def linear_grid(seq_lens: tuple[int, ...], tokens: tuple[int, ...]) -> Grid:
    """Linear ops in prefill at batch 1: the token counts `tokens` and the grid's sequence lengths."""
    return Grid(batches=(1,), seq_lens=seq_lens, candidates=(1,), linear_tokens=tokens)


def sweep_stages(models: list[ModelConfig], dtype: str, linear: Grid, attention: Grid) -> list[SweepStage]:
    """Each model's linear ops, then each model's attention: an interrupted campaign has the
    GEMMs of every model first, which every latency answer needs."""
    return [
        *(
            SweepStage(f"linear-{m.name}", m, linear, LINEAR_OPS, ("prefill",), f"{m.name}-{dtype}-linear.csv")
            for m in models
        ),
        *(
            SweepStage(f"attention-{m.name}", m, attention, ATTENTION, PHASES, f"{m.name}-{dtype}-attention.csv")
            for m in models
        ),
    ]


# The GPU check's points: GEMMs of one or a few token rows and the attention of trees, the
# short kernels a CUDA-event timing overstates (re-timed in graphs under 50 us), and the twin at
# 7B shapes in the eager and CUDA-graph regimes.
CHECK_TOKENS = (1, 2, 4, 8, 16, 32, 64)
CHECK_BATCHES = (1, 4, 16)
CHECK_SIZES = (16, 64)
CHECK_ATTENTION = Grid(batches=CHECK_BATCHES, seq_lens=(128,), candidates=(1, 16, 64))
# Eager steps over two rounds: one round's first settings ran 1.7-3x slower on a lent H200
# (profilers/measurements/h200/gpu-check-2026-11-27); a graph is timed after its capture.
CHECK_TWINS = (TwinTiming(Launch.EAGER, profile=False, rounds=2), TwinTiming(Launch.GRAPH, profile=False, rounds=1))


def short_linear(model: ModelConfig, dtype: str, grid: Grid) -> SweepStage:
    """The check's linear ops at a few token rows, in a folder of their own."""
    return SweepStage("linear-short", model, grid, LINEAR_OPS, ("prefill",), f"check/{model.name}-{dtype}-linear.csv")


def gpu_check_stages(device: str, dtype: str) -> list[Stage]:
    """The short GPU check (a lease of minutes): host dispatch, short kernels, the twin in
    both regimes; on a CPU the same stages in small, eager and static (a CPU has no graph)."""
    if device == "cuda":
        model = load_model("llama-7b")
        return [
            HostDispatchStage("host-dispatch", quick=False),
            short_linear(model, dtype, linear_grid((128,), CHECK_TOKENS)),
            SweepStage(
                "attention-tree",
                model,
                CHECK_ATTENTION,
                FUSED_OPS,
                ("decode", "tree"),
                f"check/{model.name}-{dtype}-attention.csv",
            ),
            *(
                twin_stage("llama-2-7b", dtype, CHECK_BATCHES, 4, sizes=CHECK_SIZES, timing=timing)
                for timing in CHECK_TWINS
            ),
        ]
    model = load_model(QUICK_MODEL)
    return [
        HostDispatchStage("host-dispatch", quick=True),
        short_linear(model, dtype, linear_grid((16,), QUICK_TOKENS)),
        *(
            twin_stage(QUICK_MODEL, dtype, (1,), prompts=1, new_tokens=8, timing=TwinTiming(launch))
            for launch in (Launch.EAGER, Launch.STATIC)
        ),
    ]


def plan_for(device: str, variant: str = "full", dtype: str | None = None) -> Plan:
    """The campaign for `device` (cpu or cuda): `full`, what a lent GPU measures (the paper's
    models on the paper grid with linear ops on the fine token grid, every preset's GEMM
    shapes; on a CPU the sweep's CPU defaults: llama-7b on the quick grid), or `quick`: the
    bundled model on a few points, every stage of the full plan in small."""
    if variant not in VARIANTS:
        raise PerfkitError(f"unknown campaign variant {variant!r}; choose from {', '.join(VARIANTS)}")
    dtype = check_bench_dtype(check_dtype(dtype or default_dtype(device)))
    if variant == "gpu-check":
        timer = default_timer(device) if device == "cuda" else replace(QUICK_TIMER, flush_cache=False)
        return Plan(device, variant, dtype, timer, tuple(gpu_check_stages(device, dtype)))
    if variant == "quick":
        model = load_model(QUICK_MODEL)
        stages = [
            CeilingsStage("ceilings", (dtype,), QUICK_CEILING_TIMER, streams=device == "cuda"),
            *sweep_stages([model], dtype, linear_grid((64,), QUICK_TOKENS), Grid((1,), (64,), (1, 8))),
            gemm_stage([model], QUICK_TOKENS, dtype, degrees=(1, 2)),
            twin_stage(QUICK_MODEL, dtype, (1,), prompts=1, new_tokens=8),
        ]
        # No cache flush on a CPU: writing twice its last-level cache before every sample would
        # cost more than the bundled model's kernels.
        return Plan(device, variant, dtype, replace(QUICK_TIMER, flush_cache=device == "cuda"), tuple(stages))
    if device == "cuda":
        models = [load_model(m) for m in DEFAULT_MODELS]
        linear = linear_grid(PAPER_GRID.seq_lens, fine_token_grid(max(PAPER_GRID.seq_lens)))
        attention, gemm_tokens, gemm_models = PAPER_GRID, fine_token_grid(GEMM_TOKENS_UP_TO), list(PRESETS.values())
    else:
        models = [load_model("llama-7b")]
        largest = max(QUICK_GRID.seq_lens)
        powers = tuple(2**k for k in range(largest.bit_length()))  # 1, 2, 4, ..., 512
        linear, attention, gemm_tokens, gemm_models = (
            linear_grid(QUICK_GRID.seq_lens, powers),
            QUICK_GRID,
            powers,
            models,
        )
    stages = [
        CeilingsStage("ceilings", None, CEILING_TIMER),
        *sweep_stages(models, dtype, linear, attention),
        gemm_stage(gemm_models, gemm_tokens, dtype),
        # 7B shapes on a GPU, batch 1-16; on a CPU the ~1B TinyLlama, batch 1-8
        twin_stage("llama-2-7b", dtype, (1, 2, 4, 8, 16), prompts=16)
        if device == "cuda"
        else twin_stage("tinyllama-1.1b", dtype, (1, 2, 4, 8), prompts=8),
    ]
    return Plan(device, variant, dtype, default_timer(device), tuple(stages))
