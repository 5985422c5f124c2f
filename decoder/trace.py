"""A traced kernel inventory of one decoding step, on PyTorch's meta device.

The decoder's own step (decoder.medusa: candidates, tree forward, acceptance, KV update)
runs once on a weightless model whose tensors have shapes and no data, and every aten
operator it dispatches becomes a row: which part of the step, what kind of kernel, its
GEMM or attention dimensions, FLOPs and bytes moved. A 70B step traces in seconds with no
memory, so the inventory is the decoder's real kernel sequence at any model size, not a
model of it.

Meta tensors hold no values, so what the step reads back to the host (an `int(t)`, a
`.tolist()`) is answered here: a host_sync row, then a value that lets the step go on,
which makes every sequence accept its root only (see StepRecorder._host_value).

Every decoder layer launches the same kernels at the same shapes, and every sequence's
verification and commit the same ones too (each accepts its root only, at the same context):
trace_step traces a one-layer model verifying and committing one sequence, and repeats that
layer's rows num_layers times and that sequence's rows batch times, in place (a static
step, the batch at once, runs its one layer over the whole model's KV cache, which its KV
move spans). The table is
the one an unrolled trace (trace_unrolled: every layer, every sequence) records, row for
row (tests/test_trace.py checks it), some 10 times faster (a llama-7b step in about 0.04 s
instead of 0.4 s on two cores), which lets a sweep trace hundreds of points; StepTracer
traces each point of a sweep once.

    python -m decoder.trace --model llama-7b --batch 1 --context 512 --tree-size 64 --csv trace.csv
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import numpy as np
import pandas as pd

from decoder.acceptance import SCHEMES
from decoder.medusa import Decoder
from decoder.static_step import Execution
from decoder.trace_ops import TORCH_DTYPES
from decoder.trace_recorder import ROW_VALUES, StepRecorder
from decoder.trace_run import check_step, record_step, weightless_decoder
from perfmodel.base.attention_code import AttentionCode
from perfmodel.base.dtypes import default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.outputs import writable_file, write_csv
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, along, read_options, shared
from perfmodel.latency.kinds import KINDS, kernel_rows
from perfmodel.latency.traced import TRACE_COLUMNS
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.unpriced import check_dense


def trace_table(groups: list[tuple[list[tuple], int]], unclassified: set[str]) -> pd.DataFrame:
    """A trace table from runs of rows (TRACE_COLUMNS values), each repeated so many times in
    place, numbered in order: each distinct row is built once and the table taken from them
    (a batch of thousands of sequences repeats its verification rows thousands of times)."""
    distinct = pd.DataFrame([row for rows, _ in groups for row in rows], columns=list(TRACE_COLUMNS))
    starts = np.cumsum([0] + [len(rows) for rows, _ in groups])
    order = [np.tile(np.arange(start, start + len(rows)), times) for (rows, times), start in zip(groups, starts)]
    trace = distinct.take(np.concatenate(order or [np.empty(0, dtype=np.int64)])).reset_index(drop=True)
    trace["index"] = np.arange(len(trace), dtype=np.int64)
    trace.attrs["unclassified"] = sorted(unclassified)
    return trace


def repeated_runs(recorder: StepRecorder, layers: int, batch: int) -> list[tuple[list[tuple], int]]:
    """The runs of rows of a one-layer, one-sequence recording, each with how many times it
    stands in the step: its layer's `layers` times, each part's sequence rows `batch` times,
    the others once."""
    runs = []
    for tag, tagged in groupby(zip(recorder.tags, recorder.rows), key=lambda pair: pair[0]):
        times = 1 if tag is None else layers if tag[0] == "layer" else batch
        runs.append(([ROW_VALUES(row) for _, row in tagged], times))
    return runs


def one_layer(model: ModelConfig) -> ModelConfig:
    return dataclasses.replace(model, num_layers=1)


def trace_step(
    config: ModelConfig,
    batch: int,
    context: int,
    candidates: int,
    dtype: str = "fp16",
    acceptance: str = "greedy",
    **execution,
) -> pd.DataFrame:
    """Every kernel of one decoding step of `batch` sequences with `context` cached tokens
    each: plain decoding for candidates == 1, else a Medusa step over a tree of that many
    tokens. Columns TRACE_COLUMNS; attrs["unclassified"] lists operator names counted as
    elementwise only because no table names them. Traced on one layer and one sequence's
    verification, repeated (the module doc): the rows of trace_unrolled. execution: how the
    step runs, StepTracer's `launch` (a static regime traces decoder.static_step's step, the
    batch at once, instead of the eager loop), `fused` (its forward pass fused, decoder.fused,
    as the decoder runs it, or False: the reference model's, as the static step ran before, to
    price what was measured so) and `attention` (the eager loop's attention code,
    perfmodel.base.attention_code)."""
    return StepTracer(acceptance, **execution)(config, batch, context, candidates, dtype)


def trace_unrolled(
    config: ModelConfig,
    batch: int,
    context: int,
    candidates: int,
    dtype: str = "fp16",
    acceptance: str = "greedy",
    launch: Launch = Launch.EAGER,
    fused: bool = True,
) -> pd.DataFrame:
    """trace_step's table traced the long way: every layer of the model, every sequence's
    verification and commit (the reference trace_step's repetition is checked against)."""
    check_step(config, batch, context, candidates, dtype, acceptance)
    decoder = weightless_decoder(config, TORCH_DTYPES[dtype], candidates > 1)
    recorder = record_step(decoder, batch, context, candidates, acceptance, None, Execution(launch, fused))
    return trace_table([([ROW_VALUES(row) for row in recorder.rows], 1)], recorder.unclassified)


class StepTracer:
    """trace_step for a sweep (perfmodel.latency.traced.Tracer): each (model, batch, context,
    candidates, dtype) traced once for the object's life (kept as the runs of one layer's
    and one sequence's rows with their repeats, a fraction of a table), and one weightless
    one-layer decoder per (model, dtype, heads or not) reused. beyond_context: trace contexts past the model's
    trained context too, as the sweeps price them (their beyond_context column marks such
    rows): a trace holds shapes, which do not depend on the trained length. launch: the
    regime whose step is traced (a static one: decoder.static_step's, its forward fused
    unless `fused` is False: trace_step)."""

    def __init__(
        self,
        acceptance: str = "greedy",
        beyond_context: bool = False,
        launch: Launch = Launch.EAGER,
        fused: bool = True,
        attention: AttentionCode = AttentionCode.SDPA,
    ):
        self.acceptance, self.beyond_context, self.fused = acceptance, beyond_context, fused
        self.launch = Launch.parse(launch)
        self.attention = AttentionCode(attention)
        if self.attention is not AttentionCode.SDPA and self.launch.static:
            raise PerfkitError(
                f"attention {self.attention} is traced in the eager loop (as the methods' own code runs it); the "
                f"{self.launch} step runs its fused forward's"
            )
        self._decoders: dict[tuple, Decoder] = {}
        self._runs: dict[tuple, tuple[list[tuple[list[tuple], int]], set[str]]] = {}

    def __call__(
        self, config: ModelConfig, batch: int, context: int, candidates: int, dtype: str = "fp16"
    ) -> pd.DataFrame:
        if self.beyond_context:
            config = dataclasses.replace(config, max_context=None)
        point = (config, batch, context, candidates, dtype)
        if point not in self._runs:
            check_step(*point, self.acceptance)
            decoder = self._decoder(config, dtype, candidates > 1)
            if self.launch.static:  # the batch at once; its KV move spans the whole model's cache
                execution = Execution(self.launch, self.fused)
                recorder = record_step(
                    decoder, batch, context, candidates, self.acceptance, None, execution, config.num_layers
                )
            else:
                recorder = record_step(decoder, batch, context, candidates, self.acceptance, 1, Execution(self.launch))
            runs = repeated_runs(recorder, config.num_layers, batch)
            self._runs[point] = runs, recorder.unclassified
        return trace_table(*self._runs[point])

    def _decoder(self, config: ModelConfig, dtype: str, medusa: bool) -> Decoder:
        built = (config, dtype, medusa)
        if built not in self._decoders:
            self._decoders[built] = weightless_decoder(one_layer(config), TORCH_DTYPES[dtype], medusa, self.attention)
        return self._decoders[built]


def host_only_text(trace: pd.DataFrame) -> str:
    """How many host-only ops beside the kernels: views and module calls."""
    counts = trace["kind"].value_counts()
    return f"{counts.get('view', 0)} views and {counts.get('module', 0)} module calls on the host alone"


def kernel_summary(trace: pd.DataFrame) -> pd.DataFrame:
    """Per step and kind (in KINDS order, every kind listed): kernels, bytes and FLOPs."""
    totals = trace.groupby(["step", "kind"], sort=False)[["index", "bytes", "flops"]].agg(
        kernels=("index", "size"), bytes=("bytes", "sum"), flops=("flops", "sum")
    )
    steps = list(dict.fromkeys(trace["step"]))
    grid = pd.MultiIndex.from_product([steps, KINDS], names=["step", "kind"])
    return totals.reindex(grid, fill_value=0).reset_index()


# -- command line ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    model: str = field(default="llama-7b", metadata=shared(options.model))
    tree_size: int = field(
        default=64, metadata=shared(options.step_point, tree_default=64, tree_use="; the plain step is traced too")
    )
    batch: int = field(default=1, metadata=along("tree_size"))
    context: int = field(default=512, metadata=along("tree_size"))
    dtype: str | None = field(
        default=None,
        metadata=shared(
            options.dtype, allowed=tuple(TORCH_DTYPES), default_said="fp16: the inventory is of a GPU's step"
        ),
    )
    acceptance: str | None = field(default=None, metadata=shared(options.acceptance, choices=SCHEMES))
    csv: Path | None = field(default=None, metadata=shared(options.csv, what="every kernel of both steps"))


def build_parser() -> Parser:
    p = Parser(prog="python -m decoder.trace", description=__doc__.split("\n\n")[0])
    add_options(p, TraceOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(TraceOptions, build_parser().parse_args(argv))
    model = load_model(args.model)
    check_dense(model, "the reference decoder's traced step")
    dtype = args.dtype or default_dtype("cuda")  # the inventory is of a GPU's step
    sizes = list(dict.fromkeys((1, args.tree_size)))  # the plain step, then the Medusa step
    for size in sizes:  # every refusal before any tracing
        check_step(model, args.batch, args.context, size, dtype, args.acceptance)
    if args.csv:
        writable_file(args.csv, "trace table (--csv)")
    traces = []
    for size in sizes:
        started = time.perf_counter()
        trace = trace_step(model, args.batch, args.context, size, dtype, args.acceptance)
        seconds = time.perf_counter() - started
        traces.append(trace)
        step = trace["step"].iloc[0]
        print(
            f"{model.name} {step} step, batch {args.batch}, context {args.context}, {size} token(s) per sequence, "
            f"{dtype}: {len(kernel_rows(trace))} kernels ({host_only_text(trace)}), traced in {seconds:.2f} s"
        )
        summary = kernel_summary(trace).drop(columns="step")
        print(summary.to_string(index=False, formatters={"bytes": "{:,}".format, "flops": "{:,}".format}))
        if trace.attrs["unclassified"]:
            print(f"  counted as elementwise, unknown: {', '.join(trace.attrs['unclassified'])}")
    if args.csv:
        write_csv(pd.concat(traces, ignore_index=True), args.csv)
        print(f"{args.csv}: {sum(map(len, traces))} rows")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
