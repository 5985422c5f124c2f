"""Capacity planning: what fits on a device, which Medusa tree to run at each batch, how fast.

The command of perfmodel.planning.capacity (which holds the planning model and its
documentation), run as `python -m perfmodel.plan` (perfmodel/plan.py runs this module's main):
`python -m perfmodel.plan --model llama-7b --gpu a100 h100 --latency-ms 30` prints the devices
table, the bands per device and the plan in words; `--benchmark` times plan() over more than
10,000 configurations. It lives on the command floor (reports.commands) because it can trace
the decoder's step (--step traced). Its name is not perfmodel.plan: that is the planner
function (`from perfmodel import plan`), and a module of that name would shadow it once
imported.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, batch_size, options, pricing_options
from perfmodel.cli.fields import add_options, along, nested, option, read_options, shared
from perfmodel.cli.workload_options import WorkloadOptions, WorkloadSettings
from perfmodel.hardware.specs import load_all_specs
from perfmodel.latency.choice import LatencyChoice
from perfmodel.latency.step import StepFlavor
from perfmodel.models.config import load_model
from perfmodel.planning.capacity import DEFAULT_BATCHES, PlanRequest, plan, plan_deployments
from perfmodel.planning.deployment import DeploymentChoices, resolve
from perfmodel.planning.memory import DEFAULT_RESERVE
from perfmodel.planning.result import BAND_SHOWN, HELD
from perfmodel.planning.step_models import WHOLE_STEP_FLAVORS
from perfmodel.serving.capacity import ServeRequest, serve_deployments
from perfmodel.serving.summary import summary as serving_summary

__all__ = ["benchmark", "build_parser", "main"]


def benchmark(model: str = "llama-7b", repeats: int = 3) -> tuple[int, float]:
    """Configurations planned and the best time of `repeats` plan() calls: every shipped
    device x batches 1..64 (up to its max batch) x the 22 candidate tree sizes: 11,638
    configurations for llama-7b."""
    devices = list(load_all_specs())
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        result = plan(model, devices, batches=range(1, 65), latency_target_s=0.05, throughput_target=10_000)
        best = min(best, time.perf_counter() - started)
    return len(result.configs), best


DEVICE_FIELDS = {
    "name": "name",
    "tensor_parallel": "tensor parallel",
    "usable_gb": "usable memory (GB)",
    "weights_gb": "weights (GB)",
    "heads_gb": "Medusa heads (GB)",
    "kv_mb_per_token": "KV cache per token (MB)",
    "kv_mb_per_seq": "KV cache per sequence (MB)",
    "max_batch": "max batch",
    "batch": "recommended batch",
    "tree": "recommended tree",
    "speedup": "speedup vs plain",
    "per_token_ms": "per-token latency (ms)",
    "user_tokens_s": "tokens/s per user",
    "total_tokens_s": "tokens/s in all",
    "devices_needed": "devices needed",
    "latency_model": "latency",
}


def format_devices(devices: pd.DataFrame, drafter: str = "medusa") -> str:
    labels = DEVICE_FIELDS | ({} if drafter == DrafterKind.MEDUSA else {"heads_gb": f"{HELD[drafter]} (GB)"})
    shown = devices.set_index("device")[list(DEVICE_FIELDS)].rename(columns=labels)
    return shown.T.to_string(float_format=lambda x: f"{x:,.2f}")


def format_bands(bands: pd.DataFrame) -> str:
    return bands[BAND_SHOWN].to_string(index=False, float_format=lambda x: f"{x:,.2f}")


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


@dataclass(frozen=True)
class PlanOptions:
    """The command's options, each declared once: the shared ones by perfmodel.cli.options,
    the workload's by WorkloadOptions, and the plan's own here (the parser is generated from
    them, perfmodel.cli.fields)."""

    model: str = field(default="llama-7b", metadata=shared(options.model))
    gpu: list[str] | None = field(default=None, metadata=shared(options.gpu, many=True))
    spec: list[Path] | None = field(default=None, metadata=shared(options.spec, many=True))
    dtype: str | None = field(default=None, metadata=shared(options.dtype))
    weight_format: str | None = field(default=None, metadata=shared(options.precision))
    kv_cache_dtype: str | None = field(default=None, metadata=along("weight_format"))
    moe_parallel: str | None = field(default=None, metadata=along("weight_format"))
    routing: str | None = field(default=None, metadata=along("weight_format"))
    workload: WorkloadOptions = field(default_factory=WorkloadOptions, metadata=nested(WorkloadOptions))
    throughput: float | None = field(
        default=None,
        metadata=option(
            "--throughput", "aggregate throughput target, output tokens/s", type=number, metavar="TOKENS_S"
        ),
    )
    acceptance_rates: str | None = field(default=None, metadata=shared(options.acceptance_rates))
    drafter: str = field(default="medusa", metadata=shared(options.drafter, choices=tuple(DrafterKind)))
    position_rates: tuple[float, ...] | None = field(
        default=None,
        metadata=shared(
            options.position_rates,
            use="with --drafter (not medusa): the plan and the serving simulation run its chains of 1 to as many "
            "drafts as rates",
        ),
    )
    draft_config: Path | None = field(
        default=None, metadata=shared(options.draft_config, use="with --drafter and --position-rates")
    )
    batch: list[int] | None = field(
        default=None,
        metadata=option(
            "--batch",
            "batch sizes (default: every power of two up to the max batch that fits, and that batch)",
            nargs="+",
            type=batch_size,
            metavar="B",
        ),
    )
    tp: int | None = field(default=1, metadata=shared(pricing_options.tp))
    reserve: float = field(
        default=DEFAULT_RESERVE,
        metadata=option(
            "--reserve", "memory kept free per device (default %(default)s)", type=number, metavar="FRACTION"
        ),
    )
    latency: str | LatencyChoice = field(default="auto", metadata=shared(pricing_options.latency))  # parsed: a choice
    step: str = field(default="full", metadata=shared(options.step, choices=WHOLE_STEP_FLAVORS, default="full"))
    launch: str | None = field(default=None, metadata=shared(options.launch, default=None))
    csv: Path | None = field(default=None, metadata=shared(options.csv, what="the bands table (device x batch)"))
    json: bool = field(
        default=False, metadata=shared(options.json_output, what="the plan and the serving answer (with its schedules)")
    )
    benchmark: bool = field(
        default=False,
        metadata=option(
            "--benchmark", "time plan() over >= 10,000 configurations and print the rate", action="store_true"
        ),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.plan", description=__doc__.split("\n\n")[0])
    add_options(p, PlanOptions)
    return p


def plan_tracer(launch: str | None = None):
    """The decoder's tracer for --step traced (each configuration traced once; a context past
    the model's trained one priced as the full step prices it), tracing the step of the launch
    regime asked for (the eager loop by default)."""
    from decoder.trace import StepTracer  # torch loads only when a step is traced

    return StepTracer(beyond_context=True, launch=launch or "eager")


@dataclass(frozen=True)
class PlanQuestion:
    """A parsed command line as what it asks: the deployments resolved once (the plan and the
    serving search price the same step models), the unloaded plan's request, and the serving
    search's (None without a latency-percentile target)."""

    deployments: tuple
    plan: PlanRequest
    serving: ServeRequest | None
    settings: WorkloadSettings  # the workload and its targets

    def unloaded_plan(self):
        return plan_deployments(self.deployments, self.plan)

    def serving_search(self):
        if self.serving is None:
            return None
        return serve_deployments(self.deployments, self.settings.workload, self.settings.targets, self.serving)


def read_question(argv: list[str] | None = None) -> tuple[argparse.Namespace, PlanQuestion | None]:
    """The options, and what they ask (None for --benchmark)."""
    p = build_parser()
    args = read_options(PlanOptions, p.parse_args(argv))
    if args.benchmark:
        return args, None
    if not (args.gpu or args.spec):
        p.error("at least one --gpu or --spec is required")
    settings = args.workload.settings(args.throughput)
    devices = [*(args.gpu or ()), *(args.spec or ())]
    if args.launch and args.step != StepFlavor.TRACED:
        p.error(f"--launch {args.launch} prices the traced step's launches: use --step traced (not {args.step})")
    tracer = plan_tracer(args.launch) if args.step == StepFlavor.TRACED else None
    choices = DeploymentChoices(args.dtype, args.tp, args.latency, args.step, tracer, args.launch)
    workload, targets = settings.workload, settings.targets
    request = PlanRequest(
        workload.prompt,
        workload.response,
        targets.latency_s,
        targets.tokens_s,
        args.acceptance_rates,
        args.batch or DEFAULT_BATCHES,
        memory_reserve=args.reserve,
        medusa=settings.medusa,
        drafter=args.drafter,
        position_rates=args.position_rates,
        draft_config=args.draft_config,
    )
    chain = dict(drafter=args.drafter, position_rates=args.position_rates, draft_config=args.draft_config)
    asked = ServeRequest(args.acceptance_rates, settings.medusa, settings.engine, args.reserve, **chain)
    serving = asked if settings.simulated else None
    return args, PlanQuestion(
        tuple(
            resolve(
                load_model(args.model).as_served(
                    args.weight_format, args.kv_cache_dtype, args.moe_parallel, args.routing
                ),
                devices,
                choices,
            )
        ),
        request,
        serving,
        settings,
    )


def main(argv: list[str] | None = None) -> int:
    args, question = read_question(argv)
    if question is None:
        count, seconds = benchmark(args.model)
        print(f"{count:,} configurations (device x batch x tree size) in {seconds:.3f} s ({count / seconds:,.0f}/s)")
        return 0
    result = question.unloaded_plan()
    answer = question.serving_search()
    if args.json:
        print(
            json.dumps(
                {
                    "plan": json.loads(result.to_json()),
                    "serving": None if answer is None else json.loads(answer.to_json()),
                },
                indent=2,
            )
        )
    else:
        if answer is not None:  # the answer to the question asked first, the tables behind it after
            print(serving_summary(answer) + "\n\nCapacity plan, unloaded (one batch at a time):\n")
        print("Devices\n" + format_devices(result.devices, result.drafter))
        for device, bands in result.bands.groupby("device", sort=False):
            print(f"\nBands on {device} (best tree per batch)\n" + format_bands(bands))
        print("\n" + result.summary())
    if args.csv:
        write_csv(result.bands, args.csv)
        if not args.json:
            print(f"\nbands written to {args.csv}")
    return 0
