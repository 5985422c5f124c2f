"""The graph step's kernel classes against a GPU check's profile: what the per-node price does.

    python -m profilers.closed_loop.node_classes --gpu h100 h200

A GPU check profiled the reference decoder's static step by kernel class
(<device>/gpu-check-<date>/twin/*-static-classes.csv: torch.profiler's time of each class
inside the step). Here each profiled setting's static step is traced as it ran then
(decoder.trace with the reference model's forward, not decoder.fused's) and its every kernel
priced as a CUDA-graph node from the model alone (perfmodel.latency.traced, on the device's
own-kernel stack: perfmodel.latency.source.decoder_latency), twice: with the spec's
`graph_node_us` per memory-bound kernel, and with the node cost the GPU checks' graph replays
give (perfmodel.latency.graph_node); each class's sum beside the profile's, with its error.
A class the profile left empty (the H100 check filed attention under host) has none. `traced`
is the class's kernels in the trace, to be read against the profile's `kernels` (a decoder
whose step changed since the check no longer prices the step it profiled).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from decoder.trace import StepTracer
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, read_options, shared
from perfmodel.latency.graph_node import CLASSES
from perfmodel.latency.kinds import KINDS, MEMORY_KINDS
from perfmodel.latency.source import decoder_latency
from perfmodel.latency.traced import launch_costs, price_trace
from perfmodel.measured.device_view import gpu_view
from perfmodel.measured.store import MEASUREMENTS_DIR
from perfmodel.models.config import load_model

PRICES = ("spec", "replayed")  # the node price: the spec's graph_node_us, the checks' replays


def profiled_settings(classes_csv: Path) -> pd.DataFrame:
    """The model, dtype and context of each (batch, tree_size) a classes file profiled, from
    the static run beside it (<model>-<dtype>-static.csv)."""
    run_csv = classes_csv.with_name(classes_csv.name.replace("-static-classes.csv", "-static.csv"))
    if not run_csv.is_file():
        raise PerfkitError(f"{classes_csv}: no static run beside it ({run_csv.name}) to say its model and context")
    return pd.read_csv(run_csv)[["model", "dtype", "batch", "tree_size", "context"]]


def class_errors(classes_csv: Path, device: str) -> pd.DataFrame:
    """Per profiled setting and kernel class: measured seconds, and each node price's model
    seconds and error (NaN where the profile measured none)."""
    classes = pd.read_csv(classes_csv)
    settings = classes[["batch", "tree_size"]].drop_duplicates().merge(profiled_settings(classes_csv))
    view = gpu_view(device, None, [])
    # the kernels the profile measured: the static step as it ran then, its forward unfused
    tracer = StepTracer(beyond_context=True, launch=Launch.STATIC, fused=False)
    out = []
    for s in settings.itertuples():
        model = load_model(s.model)
        latency = decoder_latency(view, model, s.dtype)
        trace = tracer(model, int(s.batch), int(s.context), int(s.tree_size), s.dtype)
        parts = tuple(dict.fromkeys(trace["part"]))  # the static step's graph: every part
        row = classes[(classes["batch"] == s.batch) & (classes["tree_size"] == s.tree_size)]
        row = row[row["kernel_class"].isin(KINDS) & (row["kernel_class"] != "host_sync")].set_index("kernel_class")
        for price in PRICES:
            launch = launch_costs(latency, measured_node=price == "replayed")
            priced = price_trace(trace, latency, s.dtype, True, captured_parts=parts, launch=launch)
            sums = priced.groupby("kind")["time_s"].sum()
            row["traced"] = priced["kind"].value_counts().reindex(row.index, fill_value=0).to_numpy()
            row[f"{price}_node_us"] = launch.graph_s * 1e6
            row[f"{price}_s"] = sums.reindex(row.index).to_numpy()
            row[f"{price}_error"] = (row[f"{price}_s"] / row["measured_s"].where(row["measured_s"] > 0) - 1).to_numpy()
        out.append(row.reset_index().assign(check=classes_csv.parents[1].name, device=view.spec.key))
    return pd.concat(out, ignore_index=True)


def memory_totals(errors: pd.DataFrame) -> pd.DataFrame:
    """The memory-bound classes together, per device, check and setting."""
    memory = errors[errors["kernel_class"].isin(MEMORY_KINDS)]
    keys = ["device", "check", "batch", "tree_size"]
    summed = ["kernels", "traced", "measured_s", *(f"{p}_s" for p in PRICES)]
    totals = memory.groupby(keys, as_index=False)[summed].sum()
    for price in PRICES:
        totals[f"{price}_error"] = totals[f"{price}_s"] / totals["measured_s"] - 1
    return totals.assign(kernel_class="memory-bound")


def table_text(errors: pd.DataFrame) -> str:
    def percent(e):
        return "-" if pd.isna(e) else f"{e:+.1%}"

    shown = {
        "device": errors["device"],
        "check": errors["check"],
        "batch": errors["batch"],
        "tree": errors["tree_size"],
        "class": errors["kernel_class"],
        "kernels": errors["kernels"],
        "traced": errors["traced"],
        "measured ms": (errors["measured_s"] * 1e3).round(3),
    }
    for price in PRICES:
        shown[f"{price} node ms"] = (errors[f"{price}_s"] * 1e3).round(3)
        shown[f"{price} error"] = errors[f"{price}_error"].map(percent)
    return pd.DataFrame(shown).to_string(index=False)


def shipped_classes(device: str) -> list[Path]:
    key = gpu_view(device, None, []).spec.key
    found = sorted(MEASUREMENTS_DIR.glob(f"{key}/{CLASSES}"))
    if not found:
        raise PerfkitError(f"no GPU check of {key} profiled kernel classes ({key}/{CLASSES} under {MEASUREMENTS_DIR})")
    return found


@dataclass(frozen=True)
class NodeClassesOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    gpu: tuple[str, ...] = field(default=(), metadata=shared(options.gpu, many=True, required=True))


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.closed_loop.node_classes", description=__doc__.split("\n\n")[0])
    add_options(p, NodeClassesOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(NodeClassesOptions, build_parser().parse_args(argv))
    errors = pd.concat(
        [class_errors(path, device) for device in args.gpu for path in shipped_classes(device)], ignore_index=True
    )
    for device, part in errors.groupby("device", sort=False):
        spec, replayed = (part[f"{p}_node_us"].iloc[0] for p in PRICES)
        print(f"{device}: a memory-bound graph node at {spec:.2f} us (spec: graph_node_us), {replayed:.2f} (replays)")
    print(table_text(pd.concat([errors, memory_totals(errors)], ignore_index=True)))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
