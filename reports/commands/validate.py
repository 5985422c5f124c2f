"""python -m perfmodel.validate: predict the Medusa (or EAGLE) speedup, then run the decoder and compare.

The experiment (decoding runs, operator timings, prediction, tables) is profilers.closed_loop."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import pandas as pd

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, batch_size, options, positive_int, positive_number, pricing_options
from perfmodel.cli.fields import add_options, along, option, read_options, shared
from perfmodel.measured.engine_runs import ENGINES, default_engine_folder, read_engine_measurement
from perfmodel.serving.engine_check import compare_runs, measurement_lines
from profilers.closed_loop.compare import verdict, write_outputs
from profilers.closed_loop.config import (
    DEFAULT_SIZES,
    FLUSH_MODES,
    MIN_TIMED_BATCHES,
    VALIDATED_DRAFTERS,
    VALIDATED_SCHEMES,
    batch_configs,
)
from profilers.closed_loop.loop import run_batches
from profilers.closed_loop.twin import TWIN_DTYPES, TwinConfig, native_dtype, twin_loop
from profilers.closed_loop.twin_print import classes_path, print_twin_batch, twin_verdict


@dataclass(frozen=True)
class ValidateOptions:
    """The command's options, each declared once (perfmodel.cli.fields). Every one not for the
    twin (TWIN_ONLY) nor the batches and outputs is the ValidateConfig field of its name."""

    device: str = field(default="cpu", metadata=shared(options.device, default="cpu", default_said="cpu"))
    model: str = field(default="bundled", metadata=shared(options.model, needs_weights=True))
    sizes: tuple[int, ...] = field(
        default=tuple(DEFAULT_SIZES),
        metadata=option(
            "--sizes", "tree sizes, root included (default 2 4 8 16 32 64)", type=positive_int, nargs="+", metavar="N"
        ),
    )
    batch: list[int] = field(
        default_factory=lambda: [1],  # a list: --help says its default as [1]
        metadata=option(
            "--batch",
            "prompts decoded together; several batch sizes run one closed loop each (default %(default)s)",
            type=batch_size,
            nargs="+",
            metavar="B",
        ),
    )
    prompts: int = field(
        default=16, metadata=option("--prompts", "held-out prompts (default %(default)s)", type=positive_int)
    )
    prompt_len: int = field(
        default=64,
        metadata=option(
            "--prompt-len", "prompt tokens per held-out prompt (default %(default)s)", type=positive_int, metavar="L"
        ),
    )
    new_tokens: int = field(
        default=96,
        metadata=option(
            "--new-tokens", "tokens generated per prompt (default %(default)s)", type=positive_int, metavar="T"
        ),
    )
    threads: int = field(
        default=1,
        metadata=option(
            "--threads",
            "CPU threads for decoding and operator timing (default %(default)s: see docs/closed-loop.md)",
            type=positive_int,
        ),
    )
    rounds: int | None = field(
        default=None,
        metadata=option(
            "--rounds",
            "interleaved timing passes over the prompts (default: enough for every setting to decode "
            f"{MIN_TIMED_BATCHES} batches of prompts, and 2 at least)",
            type=positive_int,
        ),
    )
    budget: float = field(
        default=0.3,
        metadata=option(
            "--budget",
            "timer budget per operator point (default %(default)s)",
            type=positive_number,
            metavar="SECONDS",
        ),
    )
    flush: str = field(
        default="model",
        metadata=option(
            "--flush",
            "cache state of the operator timings: model = flush the model's size before each sample (default), "
            "none = warm, all = evict the last-level cache",
            choices=FLUSH_MODES,
        ),
    )
    acceptance: str | None = field(default=None, metadata=shared(options.acceptance, choices=VALIDATED_SCHEMES))
    drafter: str = field(default=DrafterKind.MEDUSA, metadata=shared(options.drafter, choices=VALIDATED_DRAFTERS))
    dynamic: bool = field(
        default=False,
        metadata=option(
            "--dynamic",
            "also run the dynamic tree (built each step from the heads' probabilities) of every size",
            action="store_true",
        ),
    )
    in_step: bool = field(
        default=False,
        metadata=option(
            "--in-step",
            "also time each operator inside the step (module hooks; an untimed pass) and print it beside its price",
            action="store_true",
        ),
    )
    weights: str = field(default="real", metadata=shared(options.twin))
    replay: Path | None = field(default=None, metadata=along("weights"))
    launch: str = field(default=Launch.EAGER, metadata=shared(options.launch))
    host_dispatch: Path | None = field(default=None, metadata=shared(pricing_options.host_dispatch))
    dtype: str | None = field(
        default=None,
        metadata=shared(
            options.dtype,
            allowed=TWIN_DTYPES,
            default_said="with --weights dummy, fp16 on a GPU, on a CPU bf16 where it has it, else fp32",
        ),
    )
    engine: str | None = field(
        default=None,
        metadata=option(
            "--engine",
            "instead of the decoder: the serving simulation against a real engine's measured load runs "
            "(python -m profilers.engine measures them)",
            choices=ENGINES,
        ),
    )
    engine_data: Path | None = field(
        default=None,
        metadata=option(
            "--engine-data",
            "the engine measurement folder (default: the one shipped for this CPU, else the first shipped)",
            type=Path,
            metavar="DIR",
        ),
    )
    csv: Path | None = field(
        default=None,
        metadata=shared(
            options.csv,
            what="the per-tree comparison (with --weights dummy, the per-class one beside it: FILE-classes.csv)",
        ),
    )
    ops_csv: Path | None = field(
        default=None,
        metadata=option("--ops-csv", "write the measured operator rows here", type=options.output_file, metavar="FILE"),
    )


TWIN_ONLY = ("weights", "replay", "dtype", "launch", "host_dispatch")


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.validate", description=__doc__.split("\n\n")[0])
    add_options(p, ValidateOptions)
    return p


def twin_main(args, started: float) -> int:
    """--weights dummy: the twin's closed loop (profilers.closed_loop.twin), batch by batch."""
    if args.replay is None:
        raise PerfkitError("--weights dummy needs --replay RECORD (a python -m decoder.measure record to replay)")
    real_only = (
        (args.flush != "model", "--flush"),
        (args.dynamic, "--dynamic"),
        (args.in_step, "--in-step"),
        (args.ops_csv, "--ops-csv"),
        (args.drafter != DrafterKind.MEDUSA, "--drafter eagle"),
    )
    for given, flag in real_only:
        if given:
            raise PerfkitError(f"{flag} is for the real closed loop; the twin (--weights dummy) does not take it")
    if args.acceptance not in (None, "greedy"):
        raise PerfkitError("the twin verifies greedily and keeps what --replay recorded: --acceptance must be greedy")
    dtype = args.dtype or ("fp16" if args.device == "cuda" else native_dtype())
    # every batch's settings checked before the first is measured: a bad one never costs a run
    configs = [
        TwinConfig(
            model=args.model,
            replay=args.replay,
            batch=batch,
            sizes=args.sizes if args.sizes != tuple(DEFAULT_SIZES) else (),
            dtype=dtype,
            device=args.device,
            prompts=args.prompts,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            rounds=args.rounds or 1,
            threads=args.threads,
            budget_s=args.budget,
            launch=args.launch,
            host_dispatch=args.host_dispatch,
        )
        for batch in dict.fromkeys(args.batch)
    ]
    tables, classes = [], []
    for config in configs:
        table, per_class, summary = twin_loop(config, log=lambda text: print(text, file=sys.stderr, flush=True))
        print(f"batch {config.batch}:")
        print_twin_batch(table, per_class, summary)
        tables.append(table)
        classes.append(per_class)
    table = pd.concat(tables, ignore_index=True)
    if args.csv:
        write_csv(table, args.csv)
        write_csv(pd.concat(classes, ignore_index=True), classes_path(args.csv))
        print(f"wrote {args.csv} and {classes_path(args.csv)}")
    print(twin_verdict(table, time.perf_counter() - started))
    return 0


def engine_main(args) -> int:
    """The serving simulation against the engine's measurement (perfmodel.serving.engine_check)."""
    measurement = read_engine_measurement(args.engine_data or default_engine_folder())
    print("\n".join(measurement_lines(measurement)))
    if args.csv:
        table = compare_runs(measurement)
        write_csv(table, args.csv)
        print(f"wrote {args.csv}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = read_options(ValidateOptions, build_parser().parse_args(argv))
    started = time.perf_counter()
    if args.engine is not None:
        return engine_main(args)
    if args.engine_data is not None:
        raise PerfkitError("--engine-data is for --engine vllm")
    if args.weights == "dummy":
        return twin_main(args, started)
    if args.replay is not None or args.dtype is not None:
        raise PerfkitError("--replay and --dtype are for the twin (--weights dummy); the real closed loop runs fp32")
    if args.launch != Launch.EAGER or args.host_dispatch is not None:
        raise PerfkitError(
            "--launch and --host-dispatch are for the twin (--weights dummy); the real closed loop prices the eager "
            "decoder's operators"
        )
    own = ("batch", "budget", "csv", "ops_csv", "engine", "engine_data", *TWIN_ONLY)
    settings = {f.name: getattr(args, f.name) for f in fields(args) if f.name not in own}
    configs = batch_configs(args.batch, budget_s=args.budget, **settings)
    table, rows = run_batches(configs, log=lambda text: print(text, file=sys.stderr, flush=True))
    write_outputs(table, rows, args.csv, args.ops_csv)
    print(verdict(table, time.perf_counter() - started))
    if args.csv:
        print(f"wrote {args.csv}")
    return 0
