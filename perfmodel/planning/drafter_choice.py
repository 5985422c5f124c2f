"""Which drafter to speculate with: each drafter's best tree side by side, per step flavour,
batch and context, from perfmodel.planning.simulations.drafter_tables, and the best of them
("off" where none beats plain decoding). What `python -m perfmodel.speedup --drafter all`
prints."""

from __future__ import annotations

import pandas as pd

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.planning.drafters import DRAFTER_NAMES, Drafter
from perfmodel.planning.schedule_format import OFF
from perfmodel.planning.simulation_summary import beyond_context_note
from perfmodel.planning.simulations import SIMULATIONS, depth_text, optima

SETTING = ["simulation", "step", "batch", "seq_len"]


def best_drafters(table: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (simulation, step, batch, seq_len): the drafter whose best tree
    has the highest speedup among those that speculate (`drafter` "off" and speedup 1 where
    none does), with each drafter's optimum beside it (`<drafter>_speedup`, `_tree_size`,
    `_depth`, `_speculate`)."""
    # each drafter's optima on its own sizes: at_edge is at its largest size searched
    best = pd.concat([optima(rows) for _, rows in table.groupby("drafter", sort=False)], ignore_index=True)
    values = ["speedup", "tree_size", "depth", "speculate", "at_edge"]
    wide = best.pivot(index=SETTING, columns="drafter", values=values)
    wide.columns = [f"{drafter}_{what}" for what, drafter in wide.columns]
    speculating = best[best["speculate"]].sort_values("speedup", ascending=False, kind="stable")
    winners = speculating.drop_duplicates(SETTING).set_index(SETTING)
    out = wide.join(winners[["drafter", "tree_size", "depth", "speedup"]]).reset_index()
    return out.fillna({"drafter": "off", "speedup": 1.0})


def cell(row, drafter: str) -> str:
    """One drafter's best tree: 'n=64', 'n=48 d=6' (EAGLE), 'gamma=5' (a draft model), or off;
    '>=' where it is the largest searched (a larger one may do better)."""
    if not row[f"{drafter}_speculate"]:
        return "off"
    size, depth = int(row[f"{drafter}_tree_size"]), row[f"{drafter}_depth"]
    edge = ">=" if row[f"{drafter}_at_edge"] else "="
    tree = (
        f"gamma{edge}{size - 1}"
        if drafter == DrafterKind.DRAFT
        else f"n{edge}{size}{depth_text({'depth': depth}, ' d={}')}"
    )
    return f"{tree} {row[f'{drafter}_speedup']:.2f}x"


def winner_text(row) -> str:
    if row["drafter"] == OFF:
        return "off (no drafter beats plain decoding)"
    return f"{DRAFTER_NAMES[row['drafter']]} {cell(row, row['drafter'])}"


def choice_lines(table: pd.DataFrame, drafters: list[Drafter]) -> list[str]:
    """What a person reads: each drafter's assumptions, then per step flavour the best drafter
    and tree per batch (simulation b) and per context (c), each drafter's best beside it."""
    lines = [f"  {DRAFTER_NAMES[d.name]}: {d.describe()}" for d in drafters]
    chosen = best_drafters(table)
    names = [d.name for d in drafters]
    for sim, setting, what in (("b", "batch", "batch"), ("c", "seq_len", "context length")):
        rows = chosen[chosen["simulation"] == sim]
        if rows.empty:
            continue
        where = next(s.what for s in SIMULATIONS if s.key == sim).split(",")[0]
        lines.append(f"  ({sim}) {where}, the best drafter and tree per {what}:")
        for step in dict.fromkeys(table["step"]):  # the flavours in the order asked
            lines.append(f"      {step} step:")
            for _, row in rows[rows["step"] == step].sort_values(setting).iterrows():
                marker = "*" if setting == "seq_len" and _beyond(table, row) else ""
                label = f"{'b' if setting == 'batch' else 's'}={row[setting]}{marker}:"
                beside = ", ".join(f"{DRAFTER_NAMES[n]} {cell(row, n)}" for n in names)
                lines.append(f"        {label:<8} {winner_text(row)} | {beside}")
    return lines + beyond_context_note(optima(table[table["simulation"] == "c"]))


def _beyond(table: pd.DataFrame, row) -> bool:
    """Whether the row's context lies beyond the model's trained one (beyond_context)."""
    match = table[(table["seq_len"] == row["seq_len"]) & table["beyond_context"]]
    return not match.empty
