"""A schedule's regret where a closed loop measured the speedups: at each measured (batch,
context), the measured speedup of the tree the schedule runs there against the best tree
measured there. regret = best - chosen (and in percent of best): 0 where the schedule picked
the measured best, the speedup it gives away elsewhere.

Closed-loop records are perfmodel.validate's CSVs (`--csv`, stored under
<measurements>/<device>/closed-loop/) and the twin's runs (<device>/twin/, the same columns
with --weights dummy): one row per (batch, tree size, context) with `measured_speedup`.
Plain decoding is speedup 1 by definition: it is added where a record has no tree-1 row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.measured.command_tables import read_command_csvs
from perfmodel.measured.store import measurement_roots, stored_closed_loops
from perfmodel.planning.schedule_format import SpeculationSchedule
from perfmodel.planning.simulations import pick_best

NEEDED = ("batch", "tree_size", "context", "measured_speedup")
POINT = ["run", "batch", "context"]


def stored_closed_loop_files(device_key: str, roots: list[Path] | None = None) -> list[Path]:
    """A device's stored closed-loop CSVs: perfmodel.validate's and the twin's runs (their
    per-kernel-class tables beside them left out)."""
    twins = [
        path
        for root in roots or measurement_roots()
        for path in sorted((root / device_key / "twin").glob("*.csv"))
        if not path.stem.endswith("-classes")
    ]
    return [*stored_closed_loops(device_key, roots), *twins]


def read_closed_loops(paths) -> pd.DataFrame:
    """The rows of closed-loop CSVs, each with its file's name as `run`."""
    paths = list(paths)
    if not paths:
        raise PerfkitError("no closed-loop CSVs given")
    return read_command_csvs(paths, NEEDED, "closed-loop (perfmodel.validate --csv)", "run", lambda p: p.stem)


def with_plain(measured: pd.DataFrame) -> pd.DataFrame:
    """The rows plus a plain-decoding row (tree 1, speedup 1) at every point that lacks one."""
    points = measured[POINT].drop_duplicates()
    have = measured.loc[measured["tree_size"] == 1, POINT].drop_duplicates()
    lacking = points.merge(have, how="left", indicator=True)
    lacking = lacking[lacking["_merge"] == "left_only"].drop(columns="_merge")
    return pd.concat([measured, lacking.assign(tree_size=1, measured_speedup=1.0)], ignore_index=True)


def nearest(size: int, measured_sizes: np.ndarray) -> int:
    """The measured tree size closest to `size` in ratio, the smaller on ties."""
    gaps = np.abs(np.log(measured_sizes / size))
    return int(measured_sizes[np.lexsort((measured_sizes, gaps))[0]])


def schedule_regret(schedule: SpeculationSchedule, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per measured (run, batch, context): the schedule's tree, the tree whose measured
    speedup stands for it (itself, or the nearest measured size where it was not measured:
    `exact` False), the best measured tree (pick_best's rule), and the regret. Repeated rows of
    one point and tree are averaged; `run` defaults to one run."""
    missing = [c for c in NEEDED if c not in measured.columns]
    if missing:
        raise PerfkitError(f"closed-loop rows lack {', '.join(missing)}")
    rows = measured.assign(run=measured["run"] if "run" in measured else "measured")
    rows = rows.groupby([*POINT, "tree_size"], as_index=False)["measured_speedup"].mean()
    rows = with_plain(rows).rename(columns={"measured_speedup": "speedup"})
    best = pick_best(rows, by=POINT).set_index(POINT)
    out = []
    for (run, batch, context), point in rows.groupby(POINT, sort=True):
        sizes = np.sort(point["tree_size"].to_numpy())
        chosen = int(schedule.tree_size(batch, context))
        stand_in = chosen if chosen in sizes else nearest(chosen, sizes)
        chosen_speedup = float(point.loc[point["tree_size"] == stand_in, "speedup"].iloc[0])
        top = best.loc[(run, batch, context)]
        regret = float(top["speedup"]) - chosen_speedup
        out.append(
            {
                "run": run,
                "batch": int(batch),
                "context": int(context),
                "schedule_tree": chosen,
                "measured_tree": stand_in,
                "exact": stand_in == chosen,
                "chosen_speedup": chosen_speedup,
                "best_tree": int(top["tree_size"]),
                "best_speedup": float(top["speedup"]),
                "regret": regret,
                "regret_pct": 100 * regret / float(top["speedup"]),
            }
        )
    return pd.DataFrame(out)
