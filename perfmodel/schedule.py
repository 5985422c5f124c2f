"""A speculation schedule engines can load: the drafter's tree (or off) per band of batch size
and context length for one device, model, tensor-parallel degree and acceptance record.

`python -m perfmodel.schedule --model llama-7b --gpu a100` prints the bands (the tree or off,
the predicted speedup, what the step times rest on) and writes the engines' formats under
--out: vLLM's speculative configs and dynamic-speculation table, SGLang's server arguments,
TensorRT-LLM's extra LLM API options YAML, and the schedule's own JSON
(perfmodel.planning.engine_exports). --drafter picks who drafts: the Medusa heads (default),
EAGLE, a draft model, or the best of them per band. Where a closed loop measured Medusa's
speedups on the device (a CPU's stored runs, or --closed-loop FILE), it prints a Medusa
schedule's regret: the measured speedup lost against the best tree measured at each point
(perfmodel.planning.schedule_regret). The model behind the bands: perfmodel.planning.schedule.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.drafter_kind import MEASURED_ONLY, DrafterChoice, DrafterKind
from perfmodel.base.dtypes import default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.output_locks import claimed_dir
from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, batch_size, options, pricing_options, run, token_count, workload_options
from perfmodel.cli.fields import add_options, along, option, read_options, shared
from perfmodel.latency.choice import LatencyChoice
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.planning.capacity import PlanRequest, serving_plan
from perfmodel.planning.deployment import DeploymentChoices, resolve
from perfmodel.planning.drafters import DRAFTERS, KIND_NAMES, drafters_for
from perfmodel.planning.engine_export_common import drafter_weights
from perfmodel.planning.engine_export_vllm import vllm_note
from perfmodel.planning.engine_exports import ENGINES, check_engines, write_exports
from perfmodel.planning.schedule import ScheduleRequest, check_request, schedule_deployment
from perfmodel.planning.schedule_bands import DEFAULT_MAX_BATCH, default_batches
from perfmodel.planning.schedule_format import (
    ACCEPTANCE_SEPARATOR,
    FLOOR_RULE,
    OFF,
    SCHEDULE_DRAFTERS,
    SpeculationSchedule,
    TreeFamily,
)
from perfmodel.planning.schedule_regret import read_closed_loops, schedule_regret, stored_closed_loop_files
from perfmodel.planning.simulations import CANDIDATE_SIZES

DEFAULT_OUT = "perf-reports/schedule/<device>-<model>"


@dataclass(frozen=True)
class ScheduleOptions:
    """The command's options, each declared once (perfmodel.cli.fields generates the parser)."""

    model: str = field(default="llama-7b", metadata=shared(options.model))
    gpu: str | None = field(default=None, metadata=shared(options.gpu, exclusive=("device", True)))
    spec: Path | None = field(default=None, metadata=shared(options.spec, exclusive=("device", True)))
    dtype: str | None = field(default=None, metadata=shared(options.dtype))
    weight_format: str | None = field(default=None, metadata=shared(options.precision))
    kv_cache_dtype: str | None = field(default=None, metadata=along("weight_format"))
    moe_parallel: str | None = field(default=None, metadata=along("weight_format"))
    routing: str | None = field(default=None, metadata=along("weight_format"))
    tp: int | None = field(default=1, metadata=shared(pricing_options.tp))
    acceptance_rates: str | None = field(default=None, metadata=shared(options.acceptance_rates))
    latency: str | LatencyChoice = field(default="auto", metadata=shared(pricing_options.latency))  # parsed: a choice
    medusa: str = field(default="auto", metadata=shared(workload_options.medusa))
    drafter: str = field(default="medusa", metadata=shared(options.drafter, choices=tuple(SCHEDULE_DRAFTERS)))
    position_rates: tuple[float, ...] | None = field(
        default=None,
        metadata=shared(
            options.position_rates,
            use="instead of --acceleration-rates: the bands run chains of 1 to as many drafts as rates (needed by "
            "eagle3, mtp and ngram; eagle and draft take them too)",
        ),
    )
    draft_config: Path | None = field(default=None, metadata=shared(options.draft_config, use="with --position-rates"))
    batch: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--batch",
            "the batch grid (default: every power of two up to --max-batch); each point stands for the batches up "
            "to the next",
            nargs="+",
            type=batch_size,
            metavar="B",
        ),
    )
    max_batch: int = field(
        default=DEFAULT_MAX_BATCH,
        metadata=option(
            "--max-batch", "the largest batch of the default grid (default %(default)s)", type=batch_size, metavar="B"
        ),
    )
    context: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--context",
            "the context grid, cached tokens (default: 512 1024 ... 16384 within the model's context)",
            nargs="+",
            type=token_count,
            metavar="S",
        ),
    )
    sizes: tuple[int, ...] = field(
        default=CANDIDATE_SIZES,
        metadata=option(
            "--sizes",
            "Medusa's and EAGLE's tree sizes to search, root included (default: the planner's 22 sizes, 1 to 256); "
            "the draft model searches gamma 1 to 8",
            nargs="+",
            type=token_count,
            metavar="T",
        ),
    )
    engine: tuple[str, ...] = field(
        default=("all",),
        metadata=option(
            "--engine",
            "the exports to write: vllm, sglang, tensorrt-llm, json (the schedule's own), or all (default)",
            nargs="+",
            choices=(*ENGINES, "all"),
        ),
    )
    out: Path | None = field(
        default=None, metadata=shared(options.out, default=DEFAULT_OUT, what="the folder of the exports")
    )
    heads: tuple[str, ...] | None = field(
        default=None,
        metadata=option(
            "--heads",
            "the drafter's weights, path or hub id, as the engines load them: the Medusa heads, the EAGLE head or "
            "the draft model; with --drafter best, DRAFTER=PATH for each (default: placeholders, MODEL-medusa, "
            "MODEL-eagle, MODEL-draft)",
            nargs="+",
            metavar="[DRAFTER=]PATH",
        ),
    )
    json: bool = field(
        default=False,
        metadata=shared(
            options.json_output, what="the schedule (its own JSON format; files are written only with --out)"
        ),
    )
    closed_loop: tuple[Path, ...] | None = field(
        default=None,
        metadata=option(
            "--closed-loop",
            "perfmodel.validate CSVs to score the schedule against (default on a CPU: its stored closed-loop and "
            "twin runs of this model and dtype)",
            nargs="+",
            type=Path,
            metavar="FILE",
        ),
    )
    csv: Path | None = field(default=None, metadata=shared(options.csv, what="the bands table"))


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.schedule", description=__doc__.split("\n\n")[0])
    add_options(p, ScheduleOptions)
    return p


# A band's tree in the table, per drafter (str.format over the band's fields): its tokens (Medusa), tokens,
# depth and top-k (EAGLE), gamma (a draft model), or off.
TREE_TEXT = {
    "medusa": "{tree_size}",
    "eagle": "{tree_size} d={depth} k={top_k}",
    "draft": "gamma={depth}",
    **dict.fromkeys(MEASURED_ONLY, "chain K={depth}"),
    OFF: "off",
}


def format_bands(schedule: SpeculationSchedule) -> str:
    frame = schedule.to_frame()
    # a Medusa schedule's table reads as it always has; another drafter's says who drafts each band
    who = (
        {} if schedule.drafter == DrafterKind.MEDUSA else {"drafter": [KIND_NAMES.get(d, d) for d in frame["drafter"]]}
    )
    shown = pd.DataFrame(
        {
            "batch": frame["batch_min"].astype(str) + "-" + frame["batch_max"].astype(str),
            "context": frame["context_min"].astype(str) + "-" + frame["context_max"].astype(str),
            **who,
            "tree": [TREE_TEXT[b.drafter].format(**vars(b)) for b in schedule.bands],
            "draft tokens": frame["draft_tokens"],
            "speedup": [f"{x:.2f}x" for x in frame["speedup"]],
            "tokens/step": [f"{x:.2f}" for x in frame["acceptance"]],
            "rests on": frame["evidence"],
        }
    )
    return shown.to_string(index=False)


def summary(schedule: SpeculationSchedule) -> list[str]:
    several = schedule.acceptance.split(ACCEPTANCE_SEPARATOR)
    accepted = (
        [f"  acceptance: {several[0]}"] if len(several) == 1 else ["  acceptance:", *(f"    {a}" for a in several)]
    )
    return [
        f"Speculation schedule: {schedule.model} on {schedule.device}, tp={schedule.tp}, {schedule.dtype}, "
        f"{schedule.setting()}",
        f"  step times: {schedule.latency}",
        *accepted,
        f"  grid: batches {' '.join(map(str, schedule.batch_grid))}; "
        f"contexts {' '.join(map(str, schedule.context_grid))}",
        f"  bands ({FLOOR_RULE}):",
    ]


# Why vLLM's export is a second schedule, over chains, per drafter setting (a draft model's is a chain already).
CHAINS_WHY = {
    "medusa": "vLLM's Medusa drafts one token per head, top-1",
    "eagle": "vLLM's EAGLE drafts one token per pass, top-1",
    "best": "vLLM's Medusa drafts one token per head, its EAGLE one per pass, top-1",
}


def weights_arg(values: list[str] | None) -> str | dict[str, str] | None:
    """--heads: one PATH (the schedule's one drafter's weights), or DRAFTER=PATH per drafter."""
    if not values:
        return None
    named = {v.split("=", 1)[0]: v.split("=", 1)[1] for v in values if v.split("=", 1)[0] in DRAFTERS}
    plain = [v for v in values if v.split("=", 1)[0] not in DRAFTERS]
    if plain and (named or len(plain) > 1):
        raise PerfkitError(
            f"--heads takes one PATH, or DRAFTER=PATH for each of {', '.join(DRAFTERS)}; got {' '.join(values)!r}"
        )
    return plain[0] if plain else named


def plan_request(drafter: str, acceptance, position_rates=None, draft_config=None) -> PlanRequest:
    """What --tp auto's capacity plan prices: the Medusa heads' acceptance setting, the one
    drafter's curve as python -m perfmodel.speedup hands it (the plan reads Medusa's settings
    only), or the drafter's own measured chains (its steps and its memory, as the schedule
    prices them); drafters_for refuses another drafter's record here, in one line."""
    if position_rates is not None:
        return PlanRequest(drafter=drafter, position_rates=tuple(position_rates), draft_config=draft_config)
    first = drafters_for("all" if drafter == DrafterChoice.BEST else drafter, acceptance)[0]
    return PlanRequest(acceptance=first.choice if first.name == DrafterKind.MEDUSA else first.acceptance)


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


def closed_loop_rows(
    paths, rows: pd.DataFrame | None, schedule: SpeculationSchedule
) -> tuple[pd.DataFrame | None, str]:
    """Of the closed-loop `rows` read from `paths` (read_closed_loops), those of the schedule's
    model and dtype (where the files name them), and which files they come from; or None and
    why there are none."""
    if not paths:
        return None, ""
    kept = rows
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
    args = read_options(ScheduleOptions, build_parser().parse_args(argv))
    engines = check_engines(args.engine)
    # The closed loops given are read first: a missing or malformed one is one line before any
    # work, not an error after the exports are written.
    given = read_closed_loops(args.closed_loop) if args.closed_loop else None
    model = load_model(args.model).as_served(args.weight_format, args.kv_cache_dtype, args.moe_parallel, args.routing)
    # notes (a stored CPU standing in for this one) go to stderr: --json keeps stdout JSON
    view = resolve_devices([args.spec or args.gpu], log=lambda line: print(line, file=sys.stderr))[0]
    dtype = args.dtype or default_dtype(view)
    weights = weights_arg(args.heads)
    (deployment,) = resolve(
        model, [view], DeploymentChoices(dtype=dtype, tensor_parallel=args.tp, latency=args.latency)
    )
    request = ScheduleRequest(
        args.acceptance_rates,
        args.batch or default_batches(args.max_batch),
        args.context,
        args.medusa,
        args.sizes,
        drafter=args.drafter,
        position_rates=args.position_rates,
        draft_config=args.draft_config,
    )
    check_request(request)
    # auto: the capacity plan's degree; a degree given is checked to hold the model (one line
    # naming one that does, where one does), as a schedule of a deployment that cannot be is no answer
    tp, plan = serving_plan(
        deployment, plan_request(args.drafter, args.acceptance_rates, args.position_rates, args.draft_config)
    )
    if isinstance(plan, str):  # no usable degree holds it: nothing to advise, said beside the schedule
        print(f"note: {plan}; the schedule times its steps as if it fitted", file=sys.stderr)
    deployment = deployment.at(tp)
    # The folder of the exports is claimed before the schedule is worked out, and held to the
    # end: a second run into it is refused (perfmodel.base.output_locks.claimed_dir).
    with ExitStack() as held:
        if args.out:
            held.enter_context(claimed_dir(args.out, "folder of the exports"))
        schedule = schedule_deployment(deployment, request)
        weights = drafter_weights(schedule, weights)  # a --heads that names no drafter fails here, before any output
        # vLLM's Medusa drafts one token per head, its EAGLE one per pass: its export is the schedule over chains
        chains = None
        if "vllm" in engines and args.drafter in CHAINS_WHY and schedule.family != TreeFamily.CHAIN:
            chains = schedule_deployment(deployment, dataclasses.replace(request, family="chain"))
        out = args.out or Path(DEFAULT_OUT.replace("<device>", schedule.device).replace("<model>", schedule.model))
        if args.json:
            print(schedule.to_json())
            if args.out:
                write_exports(schedule, engines, args.out, weights, chains)
            return 0
        print("\n".join(summary(schedule)))
        print(format_bands(schedule))
        for note in schedule.notes:
            print(f"  note: {note}")
        if chains is not None:
            print(f"\n  vLLM's export: the same rule over chains ({CHAINS_WHY[args.drafter]}):")
            print(format_bands(chains))
            for note in chains.notes:
                print(f"  note: {note}")
        vllm_said = vllm_note(chains or schedule) if "vllm" in engines else None
        if vllm_said:
            print(f"  note: {vllm_said}")
        if not args.out:  # the default folder is held from when it is named
            held.enter_context(claimed_dir(out, "folder of the exports"))
        written = write_exports(schedule, engines, out, weights, chains)
        per_engine = Counter("json" if path.parent == out else path.parent.name for path in written)
        counts = ", ".join(f"{engine} {per_engine[engine]}" for engine in engines)
        print(f"\nwrote {len(written)} files under {out} ({counts})")
        if args.csv:
            write_csv(schedule.to_frame(), args.csv)
            print(f"bands written to {args.csv}")
        stored = stored_closed_loop_files(schedule.device) if view.is_cpu else []
        if schedule.drafter != DrafterKind.MEDUSA:  # the closed loops run the Medusa heads' trees
            if args.closed_loop or stored:
                print(f"\nno regret: the closed-loop runs measured Medusa's trees, not the {args.drafter} drafter's")
            return 0
        if given is None and stored:  # the tool's own runs: read only where they are used
            given = read_closed_loops(stored)
        rows, source = closed_loop_rows(args.closed_loop or stored, given, schedule)
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
