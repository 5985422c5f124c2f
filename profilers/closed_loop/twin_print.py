"""The twin's closed loop as a person reads it: each batch's table, where its step time goes,
how it was priced, and the verdict over every batch (profilers.closed_loop.twin measures)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from profilers.closed_loop.capture import WARMUP_COLUMN
from profilers.closed_loop.config import TARGET_ERROR

WARMUP_NOTE = (
    "warm-up: each setting's static-step warm-up before it was timed (a CUDA graph's capture, a compilation, an "
    "eager step undone), excluded from its step time"
)


def print_twin_batch(table: pd.DataFrame, classes: pd.DataFrame, summary: dict) -> None:
    """One batch's comparison as a user reads it: per tree size, then per kernel class."""
    shown = pd.DataFrame(
        {
            "tree": table["tree_size"],
            "steps": table["measured_steps"],
            "tokens/step": table["tokens_per_step"],
            "step ms measured": table["measured_step_s"] * 1e3,
            "predicted": table["predicted_step_s"] * 1e3,
            "warm-up ms": table[WARMUP_COLUMN] * 1e3,
            "overhead measured": table["measured_overhead"],
            "predicted ": table["predicted_overhead"],
            "speedup measured": table["measured_speedup"],
            "predicted  ": table["predicted_speedup"],
            "error %": table["error"] * 100,
        }
    )
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"  {WARMUP_NOTE}")
    if classes.empty:
        print("  kernel classes not profiled")
    else:
        print_classes(classes)
    print_pricing(summary)


def print_classes(classes: pd.DataFrame) -> None:
    largest = classes[classes["tree_size"] == classes["tree_size"].max()]
    print(
        f"  ms per step by kernel class, {largest['tree_size'].iloc[0]}-token tree (measured by torch.profiler / "
        "predicted from the trace):"
    )
    print(
        "  "
        + ", ".join(
            f"{r.kernel_class} {r.measured_s * 1e3:.2f}/{r.predicted_s * 1e3:.2f}" for r in largest.itertuples()
        )
    )


def print_pricing(summary: dict) -> None:
    if summary.get("plain_bandwidth_gb_s"):
        fraction = summary.get("hbm_fraction")
        of = f", {fraction:.0%} of the datasheet's" if fraction else ""
        print(
            f"  the plain step streams {summary['plain_bytes_per_step'] / 1e9:.2f} GB (weights and the KV it attends "
            f"over): {summary['plain_bandwidth_gb_s']:.0f} GB/s{of}"
        )
    if summary.get("host_dispatch"):
        print(
            f"  {summary['launch']} steps priced as host and device queues with {summary['host_dispatch']}'s host "
            f"costs, nothing calibrated; {summary['calls_replayed']} distinct calls replayed, "
            f"{summary['calls_not_replayed']} priced by the shape model instead"
        )
        return
    print(
        f"  calibration: plain step {summary['plain_step_s'] * 1e3:.2f} ms measured, its kernels replayed "
        f"{summary['priced_plain_step_s'] * 1e3:.2f} ms, so every step is its replayed kernels x "
        f"{summary['in_step_factor']:.3f}; {summary['calls_replayed']} distinct calls replayed over "
        f"{summary['replay_rounds']} rounds, {summary['calls_not_replayed']} priced by the shape model instead"
    )


def twin_verdict(table: pd.DataFrame, seconds: float) -> str:
    trees = table[table["tree_size"] > 1]
    worst = trees.loc[trees["error"].abs().idxmax()]
    within = bool((trees["error"].abs() <= TARGET_ERROR).all())
    return (
        f"twin: max |predicted - measured| / measured speedup over every batch and tree = "
        f"{abs(worst['error']) * 100:.1f}% (batch {worst['batch']}, tree {worst['tree_size']}; "
        f"{'within' if within else 'NOT within'} the {TARGET_ERROR:.0%} target); {seconds:.0f} s"
    )


def classes_path(csv: Path) -> Path:
    """Where the per-class comparison goes beside the per-tree one."""
    return csv.with_name(f"{csv.stem}-classes.csv")
