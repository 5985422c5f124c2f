"""Each launch regime's measured error: a twin run's steps priced by the model alone, in the
regime they ran in.

    python -m profilers.closed_loop.regimes --gpu NAME [RUN.csv...] [--host-dispatch FILE]

A twin run (`python -m perfmodel.validate --weights dummy --csv RUN.csv`) measured the wall
time of each step of the reference decoder at Llama shapes, in one launch regime (its `launch`
column; runs written before that column ran eager). Here each of its steps is priced as
`python -m perfmodel.speedup --tree-size T --launch R` prices it, from nothing of the run but
its shapes (batch, tree size, context): that regime's step traced (decoder.trace), its
kernels priced on the device's own-kernel stack (perfmodel.latency.source.decoder_latency:
the torch stack where the device has one), eager and static steps through the host and
device queues (perfmodel.latency.pipeline) at the host's per-op costs (the spec's
`kernel_launch_us`, or a measured `--host-dispatch` file of that host), a graph step as its
kernels, each a graph node. The twin's own prediction (kernels replayed on the device, an
in-step factor) is another thing: profilers.closed_loop.twin_results prints it. Without
RUN.csv files, every twin run shipped for the device (profilers/measurements/<device>/*/twin/).

A CUDA-graph (or compiled) run from before the twin recorded its warm-up apart timed each
setting's capture inside its steps: that capture is inferred from the run's own steps
(profilers.closed_loop.capture) and shown apart, with each step's error once it is out; a run
that recorded it shows the recorded figure, already out of its steps.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from decoder.trace import StepTracer
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.cli import Parser, options, pricing_options, run
from perfmodel.cli.fields import POSITIONAL, add_options, option, read_options, shared
from perfmodel.latency.pipeline import HostCosts
from perfmodel.latency.source import decoder_latency
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import gpu_view
from perfmodel.measured.store import MEASUREMENTS_DIR
from perfmodel.models.config import load_model
from profilers.campaign_plan import HOST_DISPATCH_FILE
from profilers.closed_loop.capture import INFERRED, NONE, RECORDED, capture_fit, twin_error, without_capture
from profilers.closed_loop.results import read_runs
from profilers.closed_loop.twin import FORWARD_COLUMN, FUSED

# The targets: a CUDA-graph step within 10%, an eager (or static) one within 15%.
TARGETS = {Launch.GRAPH: 0.10, Launch.EAGER: 0.15, Launch.STATIC: 0.15}


def run_launch(run: pd.DataFrame) -> Launch:
    """The regime a twin run's steps ran in (eager for runs from before the column)."""
    values = set(run["launch"].dropna()) if "launch" in run else set()
    if len(values) > 1:
        raise PerfkitError(f"one run holds steps of several launch regimes: {', '.join(sorted(values))}")
    return Launch.parse(values.pop() if values else "eager")


def run_fused(run: pd.DataFrame) -> bool:
    """Whether a twin run's steps ran decoder.fused's forward (its `forward` column; a run from
    before the column ran the reference model's, whatever its regime)."""
    return FORWARD_COLUMN in run and set(run[FORWARD_COLUMN].dropna()) == {FUSED}


def priced_run(run: pd.DataFrame, device: str, host: HostCosts | None, traced: dict | None = None) -> pd.DataFrame:
    """The run's steps with the model's price of each in the run's regime. traced: the steps
    already traced and priced, by (model, dtype, regime, fused), kept across runs (a host's costs
    apply after a trace is priced, so runs at other hosts share them)."""
    launch, fused = run_launch(run), run_fused(run)
    view = gpu_view(device, None, [])
    traced = {} if traced is None else traced
    out = []
    for (name, dtype), steps in run.groupby(["model", "dtype"], sort=False):
        key = (name, dtype, launch, fused)
        if key not in traced:  # the step as the run ran it: its forward fused or not
            model = load_model(name)
            tracer = StepTracer(beyond_context=True, launch=launch, fused=fused)
            traced[key] = TracedStep(model, decoder_latency(view, model, dtype), dtype, tracer, regime=launch)
        # replace() hands the new step the same cache of priced traces
        step = dataclasses.replace(traced[key], host=host)
        latency = step.latency
        predicted = step.step_time(steps["batch"], steps["context"], steps["tree_size"])
        out.append(
            steps.assign(
                launch=str(launch),
                model_step_s=predicted,
                model_error=predicted / steps["measured_step_s"].to_numpy() - 1,
                latency=latency.label,
                host=step.host_costs().label(),
            )
        )
    return pd.concat(out, ignore_index=True)


def table_text(priced: pd.DataFrame) -> str:
    shown = pd.DataFrame(
        {
            "run": priced["run"],
            "launch": priced["launch"],
            "batch": priced["batch"],
            "tree": priced["tree_size"],
            "context": priced["context"],
            "measured ms": (priced["measured_step_s"] * 1e3).round(1),
            "model ms": (priced["model_step_s"] * 1e3).round(1),
            "error": (priced["model_error"] * 100).map(lambda e: f"{e:+.1f}%"),
            "capture ms": [
                f"{c * 1e3:.0f}" if k != NONE else "-" for k, c in zip(priced["capture"], priced["capture_s"])
            ],
            "error w/o capture": [
                "-" if k == NONE else f"{e:+.1f}%" for k, e in zip(priced["capture"], priced["net_error"] * 100)
            ],
        }
    )
    return shown.to_string(index=False)


def summary_lines(priced: pd.DataFrame) -> list[str]:
    lines = []
    for launch, part in priced.groupby("launch", sort=False):
        errors = part["model_error"].abs()
        target = TARGETS.get(Launch.parse(launch))
        within = int((errors <= target).sum()) if target is not None else 0
        lines.append(
            f"{launch}: {len(part)} steps, median |error| {np.median(errors):.1%}, max {errors.max():.1%}"
            + (f"; within {target:.0%}: {within} of {len(part)}" if target is not None else "")
            + capture_summary(part, target)
        )
    return lines


def capture_summary(part: pd.DataFrame, target: float | None) -> str:
    """The regime's errors with the capture out of its steps, where any step held one."""
    if (part["capture"] == NONE).all():
        return ""
    errors = part["net_error"].abs()
    within = f"; within {target:.0%}: {int((errors <= target).sum())} of {len(part)}" if target is not None else ""
    return f"; with the capture out: median |error| {np.median(errors):.1%}, max {errors.max():.1%}{within}"


def with_capture(run: pd.DataFrame) -> pd.DataFrame:
    """A run's steps with their capture (profilers.closed_loop.capture) before they are priced."""
    return without_capture(run, run_launch(run))


def capture_lines(priced: pd.DataFrame, runs: list[pd.DataFrame]) -> list[str]:
    """Each run's capture: how it is known, and the errors once it is out of the steps."""
    lines = []
    for steps in runs:
        launch = run_launch(steps)
        part = priced[(priced["run"] == steps["run"].iloc[0]) & (priced["launch"] == str(launch))]
        kind = part["capture"].iloc[0]
        if kind == NONE:
            continue
        name = f"{steps['run'].iloc[0]} {launch}"
        raw, net = np.median(part["model_error"].abs()), np.median(part["net_error"].abs())
        if kind == RECORDED:
            low, high = (f"{part['capture_s'].agg(end) * 1e3:.0f}" for end in ("min", "max"))
            span = low if low == high else f"{low}-{high}"
            lines.append(f"capture of {name}: recorded by the run, {span} ms a setting, in no step time")
        elif kind == INFERRED:
            lines.append(
                f"capture of {name}: {capture_fit(steps, launch).label()}; with it out of each setting's steps, the "
                f"twin's price is off by a median {twin_error(part):.1%} and the model's by {net:.1%} "
                f"({raw:.1%} with it in)"
            )
        else:
            lines.append(
                f"capture of {name}: in its steps, not recorded, and not inferable (one setting, or a twin "
                "price calibrated on its plain step)"
            )
    return lines


def shipped_runs(device: str) -> list[Path]:
    """The twin runs shipped for a device, oldest folder first (folders are named by date)."""
    key = gpu_view(device, None, []).spec.key
    runs = [p for p in sorted(MEASUREMENTS_DIR.glob(f"{key}/*/twin/*.csv")) if not p.stem.endswith("-classes")]
    if not runs:
        raise PerfkitError(
            f"no twin runs are shipped for {key} (profilers/measurements/{key}/*/twin/): give RUN.csv files"
        )
    return runs


@dataclass(frozen=True)
class RegimesOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    runs: tuple[Path, ...] = field(
        default=(),
        metadata=option(
            POSITIONAL,
            "twin runs (perfmodel.validate --csv; default: every one shipped for the --gpu)",
            nargs="*",
            type=Path,
            metavar="RUN.csv",
        ),
    )
    gpu: str = field(default="", metadata=shared(options.gpu, required=True))
    host_dispatch: Path | None = field(default=None, metadata=shared(pricing_options.host_dispatch))


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.closed_loop.regimes", description=__doc__.split("\n\n")[0])
    add_options(p, RegimesOptions)
    return p


def run_host(run: Path, given: Path | None) -> HostCosts | None:
    """The host costs a run is priced at: the --host-dispatch file, else the one its campaign
    measured on the same host (a GPU check writes host-dispatch.json beside twin/), else None
    (the spec's launch cost)."""
    if given is not None:
        return HostCosts.from_json(given)
    beside = run.parent.parent / HOST_DISPATCH_FILE
    return HostCosts.from_json(beside) if beside.is_file() else None


def main(argv: list[str] | None = None) -> int:
    args = read_options(RegimesOptions, build_parser().parse_args(argv))
    paths = args.runs or shipped_runs(args.gpu)
    runs = [with_capture(run.assign(run=path.parent.parent.name)) for path, run in zip(paths, read_runs(paths))]
    traced = {}
    priced = pd.concat(
        [priced_run(run, args.gpu, run_host(path, args.host_dispatch), traced) for path, run in zip(paths, runs)],
        ignore_index=True,
    )
    priced["net_error"] = priced["model_step_s"] / priced["net_step_s"] - 1
    print(f"each step priced by the model alone in its run's regime; latency: {priced.iloc[0]['latency']}")
    for label, part in priced.groupby("host", sort=False):
        runs_named = ", ".join(dict.fromkeys(part["run"]))
        print(f"host: {label}" if priced["host"].nunique() == 1 else f"host of {runs_named}: {label}")
    print(table_text(priced))
    print("\n".join(summary_lines(priced)))
    print("\n".join(capture_lines(priced, runs)))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
