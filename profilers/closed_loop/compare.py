"""The closed loop's comparison as a user reads it: per batch, the predicted and measured
speedups, where a step's time goes, and what to know about the calibration."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perfmodel.base.outputs import write_csv
from perfmodel.measured.contract import write_table
from profilers.closed_loop.config import TARGET_ERROR
from profilers.closed_loop.predict import DECODER_PHASE_OPS
from profilers.closed_loop.tree_kind import TreeKind


def phase_table(phases: pd.DataFrame) -> pd.DataFrame:
    """One 'measured / predicted' ms column per decoder phase, one row per tree size."""
    out = pd.DataFrame({"tree": phases["tree_kind"], "tree_size": phases["tree_size"]})
    for phase in DECODER_PHASE_OPS:
        out[phase] = [
            f"{m * 1e3:.2f} / {p * 1e3:.2f}"
            for m, p in zip(phases[f"measured_{phase}_s"], phases[f"predicted_{phase}_s"])
        ]
    return out


def dynamic_against_static(table: pd.DataFrame) -> pd.DataFrame:
    """Per node count: the dynamic tree's measured and predicted speedup over the static
    tree's, and what building it costs per step."""
    key = ["batch", "tree_size"]
    static = table[table["tree_kind"] == TreeKind.STATIC].set_index(key)
    dynamic = table[table["tree_kind"] == TreeKind.DYNAMIC].set_index(key)
    out = pd.DataFrame(
        {
            "measured_dynamic_over_static": dynamic["measured_speedup"] / static["measured_speedup"],
            "predicted_dynamic_over_static": dynamic["predicted_speedup"] / static["predicted_speedup"],
            "measured_acceptance_gain": dynamic["measured_batch_acceptance"] / static["measured_batch_acceptance"],
            "measured_extra_step_ms": (dynamic["measured_step_s"] - static["measured_step_s"]) * 1e3,
            "tree_build_ms": dynamic["dynamic_tree_build_s"] * 1e3,
        }
    )
    return out.reset_index()


# The two plain-step measurements (beside the operators; in the decoding runs) share the
# machine's state, so beyond this they disagree because the machine changed under them.
PLAIN_STEP_AGREEMENT = 0.10


def calibration_notes(summary: dict) -> list[str]:
    """What a user should know about the calibration behind one batch's predictions."""
    notes = []
    plain, ops = summary["plain_step_s"], summary["ops_plain_step_s"]
    if summary["host_overhead_s"] < 0:
        notes.append(
            f"note: the plain step's operators add up to {ops / plain - 1:.0%} more than the step itself: each is "
            "timed after unrelated ones, in a random order, and finds colder caches than in the step; the "
            "negative host overhead carries that correction into every tree step"
        )
    drift = summary["decoded_plain_step_s"] / plain - 1
    if abs(drift) > PLAIN_STEP_AGREEMENT:
        notes.append(
            f"warning: the plain step timed beside the operators and in the decoding runs differ by {drift:+.0%}; "
            "the machine's speed changed during the run (something else running?): rerun on an idle machine"
        )
    return notes


def in_step_table(beside: pd.DataFrame) -> pd.DataFrame:
    """One 'in step / priced' ms column per tree size, one row per operator."""
    cells = beside.assign(
        cell=[
            f"{'-' if pd.isna(m) else f'{m * 1e3:.3f}'} / {p * 1e3:.3f}"
            for m, p in zip(beside["in_step_s"], beside["priced_s"])
        ],
        column=[
            f"{k} {n}" if k != TreeKind.PLAIN else "plain" for k, n in zip(beside["tree_kind"], beside["tree_size"])
        ],
    )
    return cells.pivot(index="op", columns="column", values="cell")[list(dict.fromkeys(cells["column"]))]


def print_batch(table: pd.DataFrame, summary: dict) -> None:
    shown = table.assign(
        predicted_step_ms=table["predicted_step_s"] * 1e3,
        measured_step_ms=table["measured_step_s"] * 1e3,
        error_pct=table["error"] * 100,
        accuracy_error_pct=table["accuracy_error"] * 100,
    )[
        [
            "tree_kind",
            "tree_size",
            "predicted_acceptance",
            "measured_acceptance",
            "predicted_batch_acceptance",
            "measured_batch_acceptance",
            "predicted_step_ms",
            "measured_step_ms",
            "predicted_speedup",
            "measured_speedup",
            "error_pct",
            "accuracy_error_pct",
            "lossless",
        ]
    ]
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    drafted = "; candidates is the drafting" if summary.get("drafting") is not None else ""
    print(
        "where a step's time goes, ms per step (measured in the decoding runs / predicted from the operators; tree "
        f"size 1 is plain decoding{drafted}):"
    )
    print(phase_table(summary["phases"]).to_string(index=False))
    if (table["tree_kind"] == TreeKind.DYNAMIC).any():
        print(dynamic_against_static(table).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(
        f"{summary['threads']} CPU thread(s); plain step: {summary['plain_step_s'] * 1e3:.2f} ms timed with the "
        "operators "
        f"({summary['decoded_plain_step_s'] * 1e3:.2f} ms in the decoding runs), its operators "
        f"{summary['ops_plain_step_s'] * 1e3:.2f} ms, "
        f"host overhead {summary['host_overhead_s'] * 1e3:.2f} ms per step (calibrated on plain decoding only)"
    )
    if summary.get("drafting") is not None:
        print(summary["drafting"].describe())
    if summary.get("in_step") is not None:
        print("each operator inside the step (hooks on) / priced, ms per step:")
        print(in_step_table(summary["in_step"]).to_string())
    for line in calibration_notes(summary):
        print(line)
    print()


def verdict(table: pd.DataFrame, seconds: float) -> str:
    """The closing line: the worst error over every batch and tree, against the target."""
    worst = table.loc[table["error"].abs().idxmax()]
    within = bool((table["error"].abs() <= TARGET_ERROR).all())
    return (
        f"max |predicted - measured| / measured over every batch and tree size = {abs(worst['error']) * 100:.1f}% "
        f"(batch {worst['batch']}, {worst['tree_kind']} tree {worst['tree_size']}; "
        f"{'within' if within else 'NOT within'} the "
        f"{TARGET_ERROR:.0%} target); {seconds:.0f} s"
    )


def write_outputs(table: pd.DataFrame, rows: pd.DataFrame, csv: Path | None, ops_csv: Path | None) -> None:
    """The comparison (--csv) and the measured operator rows (--ops-csv, data-contract format)."""
    if csv:
        csv.parent.mkdir(parents=True, exist_ok=True)
        write_csv(table, csv)
    if ops_csv:
        write_table(rows, ops_csv)
