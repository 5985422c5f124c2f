"""python -m perfmodel.roofline: the paper's Appendix G rooflines for a device and models.

Draws, for each model, the op groups qkv, qk/pv and up/gate/down in prefill and decode
over the paper's grid (Figs 9-17), and the Medusa variation studies (Figs 18-20), as PNGs
and one self-contained HTML page, and writes the full grid as a data-contract CSV. The
lines and studies are perfmodel.latency.roofline_table; the page is reports.roofline_page.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.output_locks import claimed_dir
from perfmodel.base.outputs import writable_dir, writable_file
from perfmodel.base.provenance import Provenance
from perfmodel.cli import Parser, batch_size, options, positive_int, pricing_options, token_count
from perfmodel.cli.fields import add_options, along, option, read_options, shared
from perfmodel.latency.attention_table import write_measured_attention
from perfmodel.latency.choice import LatencyChoice
from perfmodel.latency.roofline_table import DEFAULT_MODELS
from perfmodel.measured.contract import write_table
from perfmodel.measured.device_view import device_key, is_cpu_name, resolve_view
from perfmodel.models.config import load_model
from perfmodel.models.grid import PAPER_GRID, QUICK_GRID, check_arithmetic
from perfmodel.models.operators import DEFAULT_OPS
from reports.figure_cache import figure_cache
from reports.output_folder import staged
from reports.render import Renderer
from reports.roofline_page import submit_roofline_figures, write_page

DEFAULT_OUT = Path("perf-reports") / "roofline"


@dataclass(frozen=True)
class RooflineOptions:
    """The command's options, each declared once (perfmodel.cli.fields generates the parser)."""

    gpu: str | None = field(default=None, metadata=shared(options.gpu, exclusive=("device", True)))
    spec: Path | None = field(default=None, metadata=shared(options.spec, exclusive=("device", True)))
    model: list[str] | None = field(default=None, metadata=shared(options.model, many=True))
    variation_model: str | None = field(
        default=None,
        metadata=option(
            "--variation-model",
            "model for the Medusa variation figures (default: the last --model, llama-33b as in the paper)",
            metavar="NAME|PATH",
        ),
    )
    dtype: str | None = field(default=None, metadata=shared(options.dtype))
    weight_format: str | None = field(default=None, metadata=shared(options.precision))
    kv_cache_dtype: str | None = field(default=None, metadata=along("weight_format"))
    moe_parallel: str | None = field(default=None, metadata=along("weight_format"))
    routing: str | None = field(default=None, metadata=along("weight_format"))
    batch: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--batch", "batch sizes (default 1..64, powers of two)", nargs="+", type=batch_size, metavar="B"
        ),
    )
    seq: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--seq", "sequence lengths (default 128..8192, powers of two)", nargs="+", type=token_count, metavar="S"
        ),
    )
    candidates: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--candidates", "Medusa candidates (default 1,16,...,112)", nargs="+", type=token_count, metavar="Q"
        ),
    )
    medusa_heads: int | None = field(
        default=None,
        metadata=option(
            "--medusa-heads",
            "Medusa heads for the medusa_heads op (default: the model's)",
            type=positive_int,
            metavar="K",
        ),
    )
    out: Path | None = field(default=None, metadata=shared(options.out, default=f"{DEFAULT_OUT}/<device>"))
    csv: Path | None = field(
        default=None, metadata=shared(options.csv, what="the grid table", default="DIR/roofline.csv")
    )
    measurements: tuple[Path, ...] | None = field(
        default=None,
        metadata=option(
            "--measurements",
            "measured rows (data-contract CSV/Parquet) to overlay (default: the device's shipped sweeps)",
            type=Path,
            nargs="+",
            metavar="FILE",
        ),
    )
    measure: bool = field(
        default=False,
        metadata=option(
            "--measure",
            "first run a quick sweep on this machine's device (--gpu cpu, or the GPU named), then draw it",
            action="store_true",
        ),
    )
    jobs: int | None = field(default=None, metadata=shared(options.jobs))
    latency: str | LatencyChoice = field(default="auto", metadata=shared(pricing_options.latency))  # parsed: a choice


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.roofline", description=__doc__.split("\n\n")[0])
    add_options(p, RooflineOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = read_options(RooflineOptions, build_parser().parse_args(argv))
    cpu = is_cpu_name(args.gpu)
    dtype = check_dtype(args.dtype or default_dtype("cpu" if cpu else "cuda"))
    names = args.model or (["llama-7b"] if cpu or args.measure else DEFAULT_MODELS)
    models = [
        load_model(m).as_served(args.weight_format, args.kv_cache_dtype, args.moe_parallel, args.routing) for m in names
    ]
    if args.medusa_heads:
        models = [m.with_medusa_heads(args.medusa_heads) for m in models]
    grid = (QUICK_GRID if cpu or args.measure else PAPER_GRID).narrowed(args.batch, args.seq, args.candidates)
    variation_model = load_model(args.variation_model) if args.variation_model else models[-1]
    for model in dict.fromkeys([*models, variation_model]):
        check_arithmetic(model, grid, DEFAULT_OPS)
        # the paper's own grid runs past llama-7b's context on purpose; a --seq the user chose is worth a word
        past = [s for s in args.seq or () if model.max_context and s > model.max_context]
        if past:
            print(
                f"note: --seq {', '.join(map(str, past))} is past {model.name}'s {model.max_context}-token context; "
                "those points are priced, but the model cannot run there",
                file=sys.stderr,
            )
    # Where output goes is checked before a sweep (--measure) or the figures, not after them, and
    # held to the end: a second run into the folder is refused (perfmodel.base.output_locks.claimed_dir).
    with ExitStack() as held:
        if args.out:
            held.enter_context(claimed_dir(args.out))
        elif args.measure:
            writable_dir(DEFAULT_OUT / device_key(args.gpu, args.spec))
        if args.csv:
            writable_file(args.csv, "grid table")
        if args.measure:
            # Only a --measure run loads the sweeper: it imports torch (about a second), which
            # drawing the rooflines from specs and stored measurements never needs.
            from profilers.sweep_runs import measure_now

            files = measure_now(args.gpu, args.spec, models, dtype, grid)
        else:
            files = list(args.measurements or [])
        view = resolve_view(args.gpu, args.spec, files)
        out = args.out or held.enter_context(claimed_dir(DEFAULT_OUT / view.spec.key))
        view.spec.peak_flops(dtype)

        # Everything is written into a staging folder inside `out` and moved in only once it is all
        # there (reports.output_folder): a full disk or an interruption leaves the last run whole.
        with Renderer(args.jobs, figure_cache()) as renderer, staged(out) as folder:
            figures, tables, errors = submit_roofline_figures(
                renderer, view, models, variation_model, dtype, grid, args.latency
            )
            table = pd.concat([t for t in tables if not t.empty], ignore_index=True)
            csv_path = (
                write_table(table, args.csv) if args.csv else out / write_table(table, folder / "roofline.csv").name
            )
            html_path = out / write_page(folder, view, dtype, figures, errors).name
            attention = [
                write_measured_attention(folder, view.evidence, model, dtype, LatencyChoice.of(args.latency).stack)
                for model in ([] if view.is_cpu else models)
            ]
        measured = sum((t["source"] == Provenance.MEASURED).sum() for t in tables)
        print(f"{view.spec.name} ({view.spec.key}), {dtype}: {len(figures)} figures in {out}/")
        print(f"  latency: {'; '.join(dict.fromkeys(table['latency_model'].dropna()))}")
        if view.sources:
            print(f"  measured: {measured} rows from {', '.join(str(p) for p in view.sources)}")
        for line in filter(None, attention):
            print(line.replace(str(folder), str(out)))
        print(f"  html: {html_path}")
        print(f"  csv:  {csv_path} ({len(table)} rows)")
        print(f"  done in {time.perf_counter() - started:.1f} s")
        return 0
