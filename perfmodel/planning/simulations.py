"""Medusa speedup: acceleration rate over step overhead, and the best tree size.

speedup(n) = acc(n) / (T_step(n) / T_step(1)) for a tree of n tokens (root included), a
step model (perfmodel.latency.step) and an acceptance model (perfmodel.acceptance.rates). n = 1 is plain
decoding (speedup 1); where no n > 1 beats it, the answer is "do not speculate".

`simulate` runs the paper's three simulations (Appendix G.3) on any device: (a) b=1,
s=1024 over tree sizes; (b) s=1024 over batch; (c) b=4 over context length, for the
paper's simplified step, the whole-model step and the decoder's traced step
(perfmodel.planning.step_models), for any drafter (perfmodel.planning.drafters: the Medusa
heads, EAGLE, a draft model). `draft_model_table` is speculative decoding with a draft
model (Leviathan et al.), for comparison. The command line is
`python -m perfmodel.speedup`; the figures are reports.speedup_figures'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import AcceptanceChoice, AcceptanceModel, draft_model_improvement, draft_model_tokens
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import load_all_specs
from perfmodel.latency.step import StepModel
from perfmodel.latency.step_cost import StepCost
from perfmodel.measured.device_view import DeviceView, resolve_devices
from perfmodel.planning.deployment import Deployment
from perfmodel.planning.drafters import (
    DEFAULT_DRAFT_COST,
    DRAFT_ALPHAS,
    DRAFT_GAMMAS,
    Drafter,
    medusa_drafter,
)

# Tree sizes searched for the optimum: dense where trees are common, up to 256 tokens.
CANDIDATE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def speedup_table(step: StepCost, acceptance: AcceptanceModel, batch, seq_len, sizes=CANDIDATE_SIZES) -> pd.DataFrame:
    """One row per (batch, seq_len, tree size): step times, overhead, acceptance, speedup.

    batch and seq_len are ints or 1-D sequences; every combination with every size is
    evaluated in one vectorised pass.
    """
    batches = np.atleast_1d(np.asarray(batch, dtype=np.int64))
    seqs = np.atleast_1d(np.asarray(seq_len, dtype=np.int64))
    sizes = np.atleast_1d(np.asarray(sizes, dtype=np.int64))
    if (sizes < 1).any():
        raise PerfkitError(f"tree sizes must be >= 1, got {sizes.min()}")
    b, s, n = (a.ravel() for a in np.meshgrid(batches, seqs, sizes, indexing="ij"))
    plain = step.step_time(b, s, 1)
    medusa = np.where(n > 1, step.step_time(b, s, n), plain)
    acc = np.where(n > 1, acceptance(n), 1.0)
    overhead = medusa / plain
    return pd.DataFrame(
        {
            "batch": b,
            "seq_len": s,
            "tree_size": n,
            "plain_step_s": plain,
            "medusa_step_s": medusa,
            "overhead": overhead,
            "acceptance": acc,
            "speedup": acc / overhead,
            "tokens_per_s_per_seq": acc / medusa,
        }
    )


def speculates(rows: pd.DataFrame) -> pd.Series:
    """Whether each best row is a tree that beats plain decoding (False: "do not speculate")."""
    return (rows["tree_size"] > 1) & (rows["speedup"] > 1.0)


def pick_best(table: pd.DataFrame, by=("batch", "seq_len"), eligible=None) -> pd.DataFrame:
    """The best row per group `by` of a speedup table: the highest speedup among the
    `eligible` rows (a boolean mask; all by default), the smallest tree on ties, so plain
    decoding (tree size 1, speedup 1) wins a tie with a tree. The rows keep the table's index
    and order, with `speculate` False ("do not speculate") where no tree n > 1 beats speedup 1.
    The one rule every best tree (simulations, plan bands) comes from."""
    rows = table if eligible is None else table[np.asarray(eligible, dtype=bool)]
    ordered = rows.sort_values([*by, "tree_size"], kind="stable")
    best = table[table.index.isin(ordered.groupby(list(by), sort=False)["speedup"].idxmax())]
    return best.assign(speculate=speculates(best))


def best_sizes(table: pd.DataFrame) -> pd.DataFrame:
    """The best tree size per (batch, seq_len) of a speedup_table (pick_best); `speculate`
    is False (best size 1, speedup 1) where no tree beats plain decoding."""
    return pick_best(table).reset_index(drop=True)


def size_text(row) -> str:
    """A best tree size, as '>= n' where it is the largest size searched (the curve may still
    rise beyond it, so it is a bound, not an optimum)."""
    return f">= {row['tree_size']}" if row.get("at_edge", False) else str(row["tree_size"])


def depth_text(row, form: str = " (depth {})") -> str:
    """A tree's depth in `form` where the row has one (EAGLE's passes, a draft model's gamma;
    a Medusa tree's depth is its built tree's), else nothing."""
    depth = row.get("depth", pd.NA) if hasattr(row, "get") else getattr(row, "depth", pd.NA)
    return "" if pd.isna(depth) else form.format(int(depth))


def verdict(row) -> str:
    """A sentence a person can act on, for one row of best_sizes or optima."""
    if not row["speculate"]:
        return f"batch {row['batch']}, context {row['seq_len']}: do not speculate (no tree beats plain decoding)"
    return (
        f"batch {row['batch']}, context {row['seq_len']}: tree of {size_text(row)} tokens{depth_text(row)}, "
        f"{row['acceptance']:.2f} tokens/step at {row['overhead']:.2f}x step time -> {row['speedup']:.2f}x"
    )


# ---------------------------------------------------------------------------------------
# The paper's three simulations (Appendix G.3) for any device.
# ---------------------------------------------------------------------------------------


# Tree sizes of the simulation curves: every size to 16, then every 4th to 64 and every
# 8th to 256 (16, 32, ..., 128 included), dense enough to place the optimum within 4-8 tokens.
SIMULATION_SIZES = tuple(range(1, 17)) + tuple(range(20, 65, 4)) + tuple(range(72, 257, 8))
SIMULATION_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SIMULATION_SEQS = (128, 256, 512, 1024, 2048, 4096, 8192)
STEP_LABELS = {
    "paper": "paper step (App. G.3 block)",
    "full": "full step (whole model)",
    "traced": "traced step (decoder's kernels)",
}


@dataclass(frozen=True)
class Simulation:
    """One of the paper's simulated settings: a (batch, seq_len) grid swept over tree sizes."""

    key: str  # a, b, c
    name: str  # used in file names
    batches: tuple[int, ...]
    seqs: tuple[int, ...]
    what: str
    line_by: str | None = None  # the swept setting, drawn one line each


SIMULATIONS = (
    Simulation("a", "b1-s1024", (1,), (1024,), "b=1, s=1024"),
    Simulation("b", "s1024-by-batch", SIMULATION_BATCHES, (1024,), "s=1024, batch 1..256", "batch"),
    Simulation("c", "b4-by-seq", (4,), SIMULATION_SEQS, "b=4, s=128..8192", "seq_len"),
)


def mark_best(table: pd.DataFrame, by=("batch", "seq_len")) -> pd.DataFrame:
    """`table` with a `best` column: True on the best row per group (pick_best)."""
    return table.assign(best=table.index.isin(pick_best(table, by).index))


def simulate(steps: dict[str, StepModel], acceptance, simulations=SIMULATIONS, sizes=SIMULATION_SIZES) -> pd.DataFrame:
    """Every simulation for every step model: speedup_table rows with `simulation`, `step`
    and `best` columns. steps maps a label ("paper", "full") to its StepModel."""
    frames = []
    for sim in simulations:
        for label, step in steps.items():
            table = speedup_table(step, acceptance, sim.batches, sim.seqs, sizes)
            frames.append(table.assign(simulation=sim.key, step=label))
    table = pd.concat(frames, ignore_index=True)
    return mark_best(table, ("simulation", "step", "batch", "seq_len"))


def optima(table: pd.DataFrame) -> pd.DataFrame:
    """The best rows of a simulate() table (its `best` column, from pick_best), with
    `speculate` as in pick_best and `at_edge` where the best size is the largest one
    searched (a bound: a larger tree may do better)."""
    best = table[table["best"]].reset_index(drop=True)
    speculate = speculates(best)
    return best.assign(speculate=speculate, at_edge=speculate & (best["tree_size"] == table["tree_size"].max()))


def draft_model_table(alphas=DRAFT_ALPHAS, gammas=DRAFT_GAMMAS, cost_ratio: float = DEFAULT_DRAFT_COST) -> pd.DataFrame:
    """Speculative decoding with a draft model: tokens per step E and walltime improvement
    E / (c gamma + 1) for each (alpha, gamma), c = cost_ratio."""

    a, g = (x.ravel() for x in np.meshgrid(np.asarray(alphas, dtype=float), np.asarray(gammas), indexing="ij"))
    return pd.DataFrame(
        {
            "alpha": a,
            "gamma": g,
            "cost_ratio": float(cost_ratio),
            "tokens_per_step": draft_model_tokens(a, g),
            "improvement": draft_model_improvement(a, g, cost_ratio),
        }
    )


def loses_from(best: pd.DataFrame, setting: str) -> int | None:
    """The smallest value of `setting` (batch, seq_len) from which on no tree beats plain
    decoding, or None when the largest value still speculates."""
    rows = best.sort_values(setting)
    if rows["speculate"].iloc[-1]:
        return None
    wins = rows.loc[rows["speculate"], setting]
    return int(rows.loc[rows[setting] > (wins.max() if len(wins) else 0), setting].min())


# ---------------------------------------------------------------------------------------
# One device's simulations: its step models, acceptance, and what they print and draw.
# ---------------------------------------------------------------------------------------

CSV_COLUMNS = [
    "device",
    "model",
    "dtype",
    "simulation",
    "step",
    "drafter",
    "batch",
    "seq_len",
    "tree_size",
    "depth",
    "plain_step_s",
    "medusa_step_s",
    "overhead",
    "acceptance",
    "speedup",
    "tokens_per_s_per_seq",
    "best",
    "max_context",
    "beyond_context",
    "acceptance_model",
    "latency_model",
    "source",
]


def choose_devices(gpus, spec_files, every: bool) -> list[DeviceView]:
    """The devices asked for, each once: --all, --spec FILE ..., or --gpu NAME ... (cpu:
    this machine's CPU from its stored measured ceilings)."""
    return resolve_devices(list(load_all_specs().values()) if every else spec_files or gpus)


def device_table(
    deployment: Deployment,
    flavors,
    acceptance: AcceptanceChoice | list[Drafter],
    simulations=SIMULATIONS,
    sizes=SIMULATION_SIZES,
) -> pd.DataFrame:
    """The three simulations (or those given, over `sizes`) of one deployment
    (perfmodel.planning.deployment: its model split deployment.tp ways on its device, priced
    by its latency source as the capacity plan prices it; a traced flavour by its tracer),
    in the CSV's columns, for each step flavour of `flavors`. acceptance: the Medusa heads'
    (an AcceptanceChoice), or the drafters to price (perfmodel.planning.drafters), one after
    the other: each one's steps over the same step flavours (priced once), searched over its
    own sizes (`sizes` where it has none); the `drafter` column says whose each row is."""
    drafters = acceptance if isinstance(acceptance, list) else [medusa_drafter(acceptance)]
    priced = deployment.steps(flavors)
    model, dtype = deployment.model, deployment.dtype
    frames = []
    for drafter in drafters:
        steps = {flavor: drafter.step(step) for flavor, step in priced.items()}
        table = simulate(steps, drafter.acceptance, simulations, drafter.sizes or sizes)
        frames.append(
            table.assign(drafter=drafter.name, depth=drafter.depths(table["tree_size"]), acceptance_model=drafter.label)
        )
    table = pd.concat(frames, ignore_index=True)
    table = table.assign(
        device=deployment.device,
        model=model.name,
        dtype=dtype,
        latency_model=next(iter(priced.values())).label,
        source="predicted",
        **context_columns(table["seq_len"], model),
    )
    return table[CSV_COLUMNS]


def context_columns(seq_len: pd.Series, model) -> dict:
    """`max_context` (the model's trained context, NA when not known) and `beyond_context`:
    the cached context alone is longer than the model was trained for. Such rows are kept,
    as the paper's simulation (c) runs llama-7b to 8192, but the model could not run them."""
    context = model.max_context
    return {
        "max_context": pd.array([context] * len(seq_len), dtype="Int64"),
        "beyond_context": (seq_len > context).to_numpy() if context else np.zeros(len(seq_len), dtype=bool),
    }
