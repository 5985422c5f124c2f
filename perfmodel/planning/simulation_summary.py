"""What one device's simulations say, in words: the best trees per simulation, the ridge point,
the summary lines `python -m perfmodel.speedup` prints, and the notes on contexts past the
model's trained one and on the datasheet's optima beside the measured ones.
"""

from __future__ import annotations

import pandas as pd

from perfmodel.acceptance.rates import AcceptanceChoice
from perfmodel.acceptance.trees import export_tree
from perfmodel.hardware import specs as hardware
from perfmodel.measured.device_view import DeviceView
from perfmodel.planning.drafters import DRAFTER_NAMES
from perfmodel.planning.simulations import depth_text, loses_from, optima, verdict


def best_trees(best: pd.DataFrame, acceptance: AcceptanceChoice) -> list[dict]:
    """Each optimum with its tree (paths of top-ranks, the reference implementation's
    format) built from the record's head accuracies."""

    cache: dict[int, list] = {}
    out = []
    for _, row in best.iterrows():
        n = int(row["tree_size"])
        if n not in cache:
            cache[n] = [list(p) for p in export_tree(acceptance.trees.tree(n), "reference")] if n > 1 else []
        out.append(
            {
                k: row[k].item() if hasattr(row[k], "item") else row[k]
                for k in ("simulation", "step", "batch", "seq_len", "tree_size", "speedup", "speculate")
            }
            | {"tree": cache[n]}
        )
    return out


def ridge(device: DeviceView, dtype: str) -> float:
    """The latency model's ridge (FLOP/byte, efficiencies applied): a d x d projection over m tokens has an
    intensity of about m, so the step turns compute-bound near batch x tree size = ridge."""

    p = device.params
    return hardware.ridge(
        device.spec.peak_flops(dtype) * p.compute_efficiency, device.spec.bandwidth * p.memory_efficiency
    )


def summary_lines(device: DeviceView, dtype: str, table: pd.DataFrame, draft: pd.DataFrame) -> list[str]:
    """What a person reads: the optimum of (a), where speculation stops paying in (b), the
    optimum per context in (c), and the draft-model comparison."""
    best = optima(table)
    steps = list(dict.fromkeys(table["step"]))
    width = max(len(f"{s} step:") for s in steps)
    lines = [
        f"  ridge of the latency model's roofline: {ridge(device, dtype):.0f} FLOP/B (linear layers turn "
        "compute-bound near batch x tree size = ridge)"
    ]
    lines.append("  (a) b=1, s=1024:")
    for step in steps:
        row = best[(best["simulation"] == "a") & (best["step"] == step)].iloc[0]
        edge = " (the largest size searched: a larger tree may do better)" if row["at_edge"] else ""
        lines.append(f"      {f'{step} step:':<{width}} {verdict(row).split(': ', 1)[1]}{edge}")
    lines.append("  (b) s=1024, best tree per batch:")
    for step in steps:
        rows = best[(best["simulation"] == "b") & (best["step"] == step)].sort_values("batch")
        lost = loses_from(rows, "batch")
        cells = [
            f"b={r.batch} n{'>=' if r.at_edge else '='}{r.tree_size}{depth_text(r, ' d={}')} {r.speedup:.2f}x"
            if r.speculate
            else f"b={r.batch} do not speculate"
            for r in rows.itertuples()
            if not lost or r.batch < lost
        ]
        end = (
            f"do not speculate from batch {lost} on"
            if lost
            else f"speculation still pays at batch {rows['batch'].max()}"
        )
        lines.append(f"      {f'{step} step:':<{width}} {', '.join(cells)}; {end}")
    lines.append("  (c) b=4, best tree per context length:")
    for step in steps:
        rows = best[(best["simulation"] == "c") & (best["step"] == step)].sort_values("seq_len")
        cells = [
            f"s={r.seq_len}{'*' if getattr(r, 'beyond_context', False) else ''} "
            + (
                f"n{'>=' if r.at_edge else '='}{r.tree_size}{depth_text(r, ' d={}')} {r.speedup:.2f}x"
                if r.speculate
                else "do not speculate"
            )
            for r in rows.itertuples()
        ]
        sizes = rows.loc[rows["speculate"], "tree_size"]
        spread = (
            "do not speculate at any length"
            if not len(sizes)
            else f"optimum {sizes.min()}"
            + (f"..{sizes.max()} tokens" if sizes.max() > sizes.min() else " tokens at every length")
        )
        lines.append(f"      {f'{step} step:':<{width}} {', '.join(cells)}; {spread}")
    lines += beyond_context_note(best[best["simulation"] == "c"])
    tops = draft.loc[draft.groupby("alpha")["improvement"].idxmax()]
    longest = draft["gamma"].max()  # best at the longest draft searched: a bound, longer may do better
    cells = [
        f"alpha {r.alpha:g} {r.improvement:.2f}x (gamma {'>= ' if r.gamma == longest else ''}{r.gamma})"
        for r in tops.itertuples()
    ]
    drafted = best[best["simulation"] == "a"]
    versus = ", ".join(f"{r.step} step {r.speedup:.2f}x" for r in drafted.itertuples())
    name = DRAFTER_NAMES[table["drafter"].iloc[0]] if "drafter" in table else DRAFTER_NAMES["medusa"]
    lines.append(
        f"  draft model (c={draft['cost_ratio'].iloc[0]:g}), best per alpha: {', '.join(cells)}; {name} at b=1, "
        f"s=1024: {versus}"
    )
    return lines


def beyond_context_note(rows: pd.DataFrame) -> list[str]:
    """The line that says which context lengths (marked *) the model was not trained for."""
    if "beyond_context" not in rows or not rows["beyond_context"].any():
        return []
    beyond = ", ".join(map(str, sorted(set(rows.loc[rows["beyond_context"], "seq_len"]))))
    model, context = rows["model"].iloc[0], rows["max_context"].iloc[0]
    return [
        f"      * s={beyond}: beyond {model}'s {context}-token context (max_position_embeddings); the model cannot "
        "run there, kept because the paper's simulation (c) runs to 8192"
    ]


def optima_side_by_side(chosen: pd.DataFrame, datasheet: pd.DataFrame) -> list[str]:
    """Where the chosen latency source's optima differ from the datasheet roofline's: one
    line per (simulation, step, batch, context) whose best tree or speedup differs."""
    key = [c for c in ("drafter", "simulation", "step", "batch", "seq_len") if c in chosen and c in datasheet]
    both = optima(chosen).merge(optima(datasheet), on=key, suffixes=("", "_datasheet"))
    differ = both[(both["tree_size"] != both["tree_size_datasheet"])]
    if differ.empty:
        return ["  datasheet and measured-latency optima agree on every tree size"]
    lines = [f"  where the datasheet roofline's optimum differs ({len(differ)} of {len(both)} settings):"]
    for r in differ.itertuples():
        lines.append(
            f"    ({r.simulation}) {r.step} step b={r.batch} s={r.seq_len}: measured-latency n={r.tree_size} "
            f"{r.speedup:.2f}x | datasheet n={r.tree_size_datasheet} {r.speedup_datasheet:.2f}x"
        )
    return lines
