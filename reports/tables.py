"""The report's tables: model output and measurements shaped into what the page shows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.planning.drafter_choice import cell
from perfmodel.planning.drafters import DRAFTER_NAMES
from perfmodel.planning.result import BAND_SHOWN, PlanResult
from reports.sources import ReportAcceptance

POINT_COLUMNS = ["op", "phase", "batch", "seq_len", "candidates", "intensity", "tflops", "time_s", "source"]
OPTIMUM_COLUMNS = ["simulation", "step", "batch", "seq_len", "tree_size", "acceptance", "overhead", "speedup"]
CLOSED_LOOP_COLUMNS = [
    "tree_size",
    "batch",
    "context",
    "measured_acceptance",
    "predicted_acceptance",
    "measured_speedup",
    "predicted_speedup",
    "error",
]


def percent(table: pd.DataFrame) -> pd.DataFrame:
    """Error columns as signed percentages, the way people read them."""
    return table.assign(**{c: [f"{v:+.1%}" for v in table[c]] for c in table.columns if c.endswith("error")})


def variation_table(points: pd.DataFrame) -> pd.DataFrame:
    """One row per (op, batch, seq_len), one column per q: 'TFLOP/s (FLOP/byte)'."""
    cells = points.assign(cell=[f"{t:.3g} ({i:.3g})" for t, i in zip(points["tflops"], points["intensity"])])
    table = cells.pivot_table(index=["op", "batch", "seq_len"], columns="candidates", values="cell", aggfunc="first")
    table.columns = [f"q={q}" for q in table.columns]
    return table.reset_index()


def points_table(points: pd.DataFrame) -> pd.DataFrame:
    """A roofline figure's points, times in microseconds."""
    shown = points[POINT_COLUMNS]
    return shown.assign(time_s=shown["time_s"] * 1e6).rename(columns={"time_s": "time_us"})


def optima_table(sims: pd.DataFrame) -> pd.DataFrame:
    """The optimum of every simulated curve."""
    return sims[sims["best"]][OPTIMUM_COLUMNS].reset_index(drop=True)


def best_per_batch(best: pd.DataFrame, step: str = "full") -> pd.DataFrame:
    """Simulation (b)'s best tree size per batch for the whole step (full or traced)."""
    rows = best[(best["simulation"] == "b") & (best["step"] == step)][["batch", "tree_size", "speedup", "speculate"]]
    return rows.reset_index(drop=True)


def drafter_table(chosen: pd.DataFrame, step: str) -> pd.DataFrame:
    """Simulation (b) for one step flavour from perfmodel.planning.drafter_choice.best_drafters:
    per batch each drafter's best tree and speedup ('n=64 2.90x', 'n=40 d=6 2.75x',
    'gamma=5 2.32x' or off, as `python -m perfmodel.speedup --drafter all` prints them) and
    the best drafter (off where none beats plain decoding), columns named by DRAFTER_NAMES."""
    rows = chosen[(chosen["simulation"] == "b") & (chosen["step"] == step)].sort_values("batch")
    table = pd.DataFrame({"batch": rows["batch"].astype(int)})
    for drafter, name in DRAFTER_NAMES.items():
        table[name] = [cell(row, drafter) for _, row in rows.iterrows()]
    table["best drafter"] = [DRAFTER_NAMES.get(d, d) for d in rows["drafter"]]
    return table.reset_index(drop=True)


def capacity_table(planned: PlanResult) -> pd.DataFrame:
    return planned.bands[BAND_SHOWN]


ERROR_HEADER = (
    "error = (predicted - measured) / measured, signed: + where the prediction is above the measurement "
    "(for times: predicted slower), - where below"
)


def signed_errors(errors: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group: how many points and the median, lowest and highest signed error. Signed, not
    |error|: a model that is always 20% slow and one that is 20% off either way are different
    models, and only the sign tells them apart."""
    summary = errors.groupby(by).agg(
        rows=("error", "size"),
        median_error=("error", "median"),
        min_error=("error", "min"),
        max_error=("error", "max"),
    )
    return summary.reset_index()


def operator_errors(op_errors: list[pd.DataFrame]) -> pd.DataFrame:
    """Per op and phase: signed_errors (empty without measurements)."""
    if not any(not e.empty for e in op_errors):
        return pd.DataFrame()
    errors = pd.concat([e for e in op_errors if not e.empty], ignore_index=True)
    if not len(errors):
        return pd.DataFrame()
    return signed_errors(errors, ["op", "phase"])


def acceptance_errors(acceptance: ReportAcceptance) -> pd.DataFrame:
    """A measured record's tokens per step per tree size against each fitted model's."""
    sizes = np.array(acceptance.record.tree_sizes)
    measured = np.array(acceptance.record.tokens_per_step)
    table = pd.DataFrame({"tree_size": sizes, "measured_tokens_per_step": measured})
    for label, model in [("log_fit", acceptance.choice.curve), ("head_accuracy", acceptance.choice.trees)]:
        if model is not None:
            table[f"{label}_predicted"] = model(sizes)
            table[f"{label}_error"] = (table[f"{label}_predicted"] - measured) / measured
    return table


ABLATION_COLUMNS = [
    "kind",
    "setting",
    "nodes",
    "depth",
    "measured_acceptance",
    "predicted_acceptance",
    "acceptance_error",
    "measured_speedup",
    "predicted_speedup",
    "speedup_error",
]


def ablation_table(ablation: pd.DataFrame) -> pd.DataFrame:
    """Every tree of a tree ablation, sparse then dense, by number of candidates."""
    return ablation.sort_values(["kind", "nodes"], ascending=[False, True])[ABLATION_COLUMNS].round(3)


def closed_loop_table(validation: pd.DataFrame) -> pd.DataFrame:
    return validation[CLOSED_LOOP_COLUMNS]
