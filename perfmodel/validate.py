"""python -m perfmodel.validate: predict the Medusa (or EAGLE) speedup, then run the decoder and compare.

The experiment (decoding runs, operator timings, prediction, tables) is profilers.closed_loop."""

from __future__ import annotations

import sys
import time

import pandas as pd

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, batch_size, options, positive_int, run
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


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.validate", description=__doc__.split("\n\n")[0])
    options.device(p, default="cpu", default_said="cpu")
    options.model(p, needs_weights=True)
    p.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        default=list(DEFAULT_SIZES),
        metavar="N",
        help="tree sizes, root included (default 2 4 8 16 32 64)",
    )
    p.add_argument(
        "--batch",
        type=batch_size,
        nargs="+",
        default=[1],
        metavar="B",
        help="prompts decoded together; several batch sizes run one closed loop each (default %(default)s)",
    )
    p.add_argument("--prompts", type=positive_int, default=16, help="held-out prompts (default %(default)s)")
    p.add_argument(
        "--prompt-len",
        type=positive_int,
        default=64,
        metavar="L",
        help="prompt tokens per held-out prompt (default %(default)s)",
    )
    p.add_argument(
        "--new-tokens",
        type=positive_int,
        default=96,
        metavar="T",
        help="tokens generated per prompt (default %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="CPU threads for decoding and operator timing (default %(default)s: see docs/closed-loop.md)",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=None,
        help="interleaved timing passes over the prompts (default: enough for every setting to decode "
        f"{MIN_TIMED_BATCHES} batches of prompts, and 2 at least)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.3,
        metavar="SECONDS",
        help="timer budget per operator point (default %(default)s)",
    )
    p.add_argument(
        "--flush",
        choices=FLUSH_MODES,
        default="none",
        help="cache state of the operator timings: none = warm (default), model = flush the model's size, all = "
        "evict the last-level cache",
    )
    options.acceptance(p, choices=VALIDATED_SCHEMES)
    options.drafter(p, choices=VALIDATED_DRAFTERS)
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="also run the dynamic tree (built each step from the heads' probabilities) of every size",
    )
    options.twin(p)
    options.launch(p)
    options.host_dispatch(p)
    options.dtype(
        p,
        allowed=TWIN_DTYPES,
        default_said="with --weights dummy, fp16 on a GPU, on a CPU bf16 where it has it, else fp32",
    )
    options.csv(p, "the per-tree comparison (with --weights dummy, the per-class one beside it: FILE-classes.csv)")
    p.add_argument("--ops-csv", type=options.output_file, metavar="FILE", help="write the measured operator rows here")
    return p


def twin_main(args, started: float) -> int:
    """--weights dummy: the twin's closed loop (profilers.closed_loop.twin), batch by batch."""
    if args.replay is None:
        raise PerfkitError("--weights dummy needs --replay RECORD (a python -m decoder.measure record to replay)")
    real_only = (
        (args.flush != "none", "--flush"),
        (args.dynamic, "--dynamic"),
        (args.ops_csv, "--ops-csv"),
        (args.drafter != DrafterKind.MEDUSA, "--drafter eagle"),
    )
    for given, option in real_only:
        if given:
            raise PerfkitError(f"{option} is for the real closed loop; the twin (--weights dummy) does not take it")
    if args.acceptance not in (None, "greedy"):
        raise PerfkitError("the twin verifies greedily and keeps what --replay recorded: --acceptance must be greedy")
    dtype = args.dtype or ("fp16" if args.device == "cuda" else native_dtype())
    # every batch's settings checked before the first is measured: a bad one never costs a run
    configs = [
        TwinConfig(
            model=args.model,
            replay=args.replay,
            batch=batch,
            sizes=tuple(args.sizes) if args.sizes != list(DEFAULT_SIZES) else (),
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    if args.weights == "dummy":
        return twin_main(args, started)
    if args.replay is not None or args.dtype is not None:
        raise PerfkitError("--replay and --dtype are for the twin (--weights dummy); the real closed loop runs fp32")
    if args.launch != Launch.EAGER or args.host_dispatch is not None:
        raise PerfkitError(
            "--launch and --host-dispatch are for the twin (--weights dummy); the real closed loop prices the eager "
            "decoder's operators"
        )
    # every other option is the ValidateConfig field of its name
    twin_only = ("weights", "replay", "dtype", "launch", "host_dispatch")
    settings = {k: v for k, v in vars(args).items() if k not in ("batch", "budget", "csv", "ops_csv", *twin_only)}
    configs = batch_configs(args.batch, budget_s=args.budget, **settings)
    table, rows = run_batches(configs, log=lambda text: print(text, file=sys.stderr, flush=True))
    write_outputs(table, rows, args.csv, args.ops_csv)
    print(verdict(table, time.perf_counter() - started))
    if args.csv:
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
