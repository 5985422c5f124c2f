"""A speculation schedule engines can load: the Medusa tree (or off) per band of batch size and
context length for one device, model, tensor-parallel degree and acceptance record.

`python -m perfmodel.schedule --model llama-7b --gpu a100` prints the bands (the tree or off,
the predicted speedup, what the step times rest on) and writes the engines' formats under
--out: vLLM's speculative configs and dynamic-speculation table, SGLang's server arguments,
TensorRT-LLM's medusa_choices YAML, and the schedule's own JSON
(perfmodel.planning.engine_exports). Where a closed loop measured speedups on the device
(a CPU's stored runs, or --closed-loop FILE), it prints the schedule's regret: the measured
speedup lost against the best tree measured at each point (perfmodel.planning.schedule_regret).
The model behind the bands: perfmodel.planning.schedule.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from perfmodel.acceptance.rates import resolve_acceptance
from perfmodel.base.dtypes import default_dtype
from perfmodel.cli import Parser, batch_size, options, run, token_count
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.planning.capacity import serving_plan
from perfmodel.planning.engine_exports import ENGINES, check_engines, write_exports
from perfmodel.planning.schedule import (
    DEFAULT_MAX_BATCH,
    FLOOR_RULE,
    SpeculationSchedule,
    default_batches,
    speculation_schedule,
)
from perfmodel.planning.schedule_regret import read_closed_loops, schedule_regret, stored_closed_loop_files
from perfmodel.planning.simulations import CANDIDATE_SIZES

DEFAULT_OUT = "perf-reports/schedule/<device>-<model>"


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.schedule", description=__doc__.split("\n\n")[0])
    options.model(p)
    device = p.add_mutually_exclusive_group(required=True)
    options.gpu(device)
    options.spec(device)
    options.dtype(p)
    options.tp(p)
    options.acceptance_rates(p)
    options.latency(p)
    options.medusa(p)
    p.add_argument(
        "--batch",
        nargs="+",
        type=batch_size,
        metavar="B",
        help="the batch grid (default: every power of two up to --max-batch); each point stands for the batches up "
        "to the next",
    )
    p.add_argument(
        "--max-batch",
        type=batch_size,
        default=DEFAULT_MAX_BATCH,
        metavar="B",
        help="the largest batch of the default grid (default %(default)s)",
    )
    p.add_argument(
        "--context",
        nargs="+",
        type=token_count,
        metavar="S",
        help="the context grid, cached tokens (default: 512 1024 ... 16384 within the model's context)",
    )
    p.add_argument(
        "--sizes",
        nargs="+",
        type=token_count,
        default=list(CANDIDATE_SIZES),
        metavar="T",
        help="tree sizes to search, root included (default: the planner's 22 sizes, 1 to 256)",
    )
    p.add_argument(
        "--engine",
        nargs="+",
        choices=(*ENGINES, "all"),
        default=["all"],
        help="the exports to write: vllm, sglang, tensorrt-llm, json (the schedule's own), or all (default)",
    )
    options.out(p, DEFAULT_OUT, what="the folder of the exports")
    p.add_argument(
        "--heads",
        metavar="PATH",
        help="the Medusa heads' path or hub id, as vLLM's speculative model (default: a placeholder, MODEL-medusa)",
    )
    options.json_output(p, "the schedule (its own JSON format; files are written only with --out)")
    p.add_argument(
        "--closed-loop",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="perfmodel.validate CSVs to score the schedule against (default on a CPU: its stored closed-loop and "
        "twin runs of this model and dtype)",
    )
    options.csv(p, "the bands table")
    return p


def format_bands(schedule: SpeculationSchedule) -> str:
    frame = schedule.to_frame()
    shown = pd.DataFrame(
        {
            "batch": frame["batch_min"].astype(str) + "-" + frame["batch_max"].astype(str),
            "context": frame["context_min"].astype(str) + "-" + frame["context_max"].astype(str),
            "tree": [str(n) if n > 1 else "off" for n in frame["tree_size"]],
            "draft tokens": frame["draft_tokens"],
            "speedup": [f"{x:.2f}x" for x in frame["speedup"]],
            "tokens/step": [f"{x:.2f}" for x in frame["acceptance"]],
            "rests on": frame["evidence"],
        }
    )
    return shown.to_string(index=False)


def summary(schedule: SpeculationSchedule) -> list[str]:
    return [
        f"Speculation schedule: {schedule.model} on {schedule.device}, tp={schedule.tp}, {schedule.dtype}, "
        f"medusa {schedule.medusa}",
        f"  step times: {schedule.latency}",
        f"  acceptance: {schedule.acceptance}",
        f"  grid: batches {' '.join(map(str, schedule.batch_grid))}; "
        f"contexts {' '.join(map(str, schedule.context_grid))}",
        f"  bands ({FLOOR_RULE}):",
    ]


REGRET_SHOWN = {
    "run": "run",
    "batch": "batch",
    "context": "context",
    "schedule_tree": "schedule tree",
    "measured_as": "measured as",
    "chosen_speedup": "its speedup",
    "best_tree": "best tree",
    "best_speedup": "best",
    "regret_text": "regret",
}


def format_regret(regret: pd.DataFrame) -> list[str]:
    shown = regret.assign(
        measured_as=[str(m) if e else f"{m} (nearest)" for m, e in zip(regret["measured_tree"], regret["exact"])],
        regret_text=[f"{r:.3f} ({p:.1f}%)" for r, p in zip(regret["regret"], regret["regret_pct"])],
    )[list(REGRET_SHOWN)].rename(columns=REGRET_SHOWN)
    worst = regret.loc[regret["regret"].idxmax()]
    lines = [shown.to_string(index=False, float_format=lambda x: f"{x:.3f}")]
    lines.append(
        f"  {int((regret['regret'] == 0).sum())} of {len(regret)} points at the measured best; mean regret "
        f"{regret['regret'].mean():.3f} ({regret['regret_pct'].mean():.1f}%), largest {worst['regret']:.3f} "
        f"({worst['regret_pct']:.1f}%) at batch {worst['batch']}, context {worst['context']} ({worst['run']})"
    )
    if not regret["exact"].all():
        lines.append("  (nearest): the schedule's tree was not measured there; the nearest measured size stands for it")
    return lines


def closed_loop_rows(paths, schedule: SpeculationSchedule) -> tuple[pd.DataFrame | None, str]:
    """The closed-loop rows of the schedule's model and dtype (where the files name them), and
    which files they come from; or None and why there are none."""
    if not paths:
        return None, ""
    rows = kept = read_closed_loops(paths)
    for column, value in (("model", schedule.model), ("dtype", schedule.dtype)):
        if column in kept:
            kept = kept[kept[column].astype(str) == value]
    if kept.empty:
        held = rows.drop_duplicates(["model", "dtype"]) if {"model", "dtype"} <= set(rows) else rows.iloc[:0]
        return None, (
            f"no closed-loop runs of {schedule.model} in {schedule.dtype} to score the schedule against"
            + (f" (they hold: {', '.join(f'{r.model} {r.dtype}' for r in held.itertuples())})" if len(held) else "")
        )
    return kept, ", ".join(sorted({Path(p).name for p in paths if Path(p).stem in set(kept["run"])}))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    engines = check_engines(args.engine)
    model = load_model(args.model)
    # notes (a stored CPU standing in for this one) go to stderr: --json keeps stdout JSON
    view = resolve_devices([args.spec or args.gpu], log=lambda line: print(line, file=sys.stderr))[0]
    dtype = args.dtype or default_dtype(view)
    tp = args.tp
    if tp is None:  # auto: the capacity plan's degree
        tp, _ = serving_plan(model, view, dtype, None, resolve_acceptance(args.acceptance_rates), args.latency)
    setting = dict(
        tp=tp,
        dtype=dtype,
        acceptance=args.acceptance_rates,
        latency=args.latency,
        batches=args.batch or default_batches(args.max_batch),
        contexts=args.context,
        medusa=args.medusa,
        sizes=args.sizes,
    )
    schedule = speculation_schedule(model, view, **setting)
    # vLLM's Medusa drafts one token per head: its export is the schedule over chains
    chains = speculation_schedule(model, view, **setting, family="chain") if "vllm" in engines else None
    out = args.out or Path(DEFAULT_OUT.replace("<device>", schedule.device).replace("<model>", schedule.model))
    if args.json:
        print(schedule.to_json())
        if args.out:
            write_exports(schedule, engines, args.out, args.heads, chains)
        return 0
    print("\n".join(summary(schedule)))
    print(format_bands(schedule))
    for note in schedule.notes:
        print(f"  note: {note}")
    if chains is not None:
        print("\n  vLLM's export: the same rule over chains (vLLM's Medusa drafts one token per head, top-1):")
        print(format_bands(chains))
        for note in chains.notes:
            print(f"  note: {note}")
    written = write_exports(schedule, engines, out, args.heads, chains)
    per_engine = Counter("json" if path.parent == out else path.parent.name for path in written)
    counts = ", ".join(f"{engine} {per_engine[engine]}" for engine in engines)
    print(f"\nwrote {len(written)} files under {out} ({counts})")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        schedule.to_frame().to_csv(args.csv, index=False)
        print(f"bands written to {args.csv}")
    stored = stored_closed_loop_files(schedule.device) if view.is_cpu else []
    rows, source = closed_loop_rows(args.closed_loop or stored, schedule)
    if rows is not None:
        print(
            f"\nRegret against the closed loop ({source}): the measured speedup of the schedule's tree vs the best "
            "tree measured"
        )
        print("\n".join(format_regret(schedule_regret(schedule, rows))))
    elif source:
        print(f"\n{source}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
