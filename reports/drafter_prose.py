"""The drafters in words: which drafter wins at which batches, what was measured of their
drafting, where each drafter's acceptance comes from, and the page's sentences about them.
"""

from __future__ import annotations

import pandas as pd

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.planning import simulations
from perfmodel.planning.drafters import DEFAULT_DRAFT_COST, DRAFT_ALPHAS, DRAFTER_NAMES, Drafter

# Who a drafter comparison names as fastest, "off" where no drafter beats plain decoding.
WINNERS = {
    "medusa": "the Medusa heads",
    "eagle": "EAGLE",
    "draft": "the draft model",
    "off": "no drafter (plain decoding)",
}


def batch_runs(batches, winners) -> list[str]:
    """Each run of consecutive batches with the same winner, in words: 'EAGLE from batch 1
    to 4', 'the draft model from batch 8 on' (the last run), 'at batch 2' (a run of one)."""
    runs: list[list] = []
    for batch, winner in zip(batches, winners):
        if runs and runs[-1][0] == winner:
            runs[-1][2] = batch
        else:
            runs.append([winner, batch, batch])
    said = []
    for i, (winner, first, last) in enumerate(runs):
        if len(runs) == 1:
            where = f"at every batch, {first} to {last}"
        elif i == len(runs) - 1:
            where = f"from batch {first} on"
        elif first == last:
            where = f"at batch {first}"
        else:
            where = f"from batch {first} to {last}"
        said.append(f"{WINNERS[winner]} {where}")
    return said


def measured_drafting_text(measured: pd.DataFrame, device: str) -> str:
    """What closed loops of EAGLE-drafted trees measured on this device, and how far the
    model's predictions of them were (measured first, as every headline)."""
    slowest = measured.loc[measured["measured_speedup"].idxmin()]
    fastest = measured.loc[measured["measured_speedup"].idxmax()]
    batches = ", ".join(str(b) for b in sorted(set(measured["batch"])))
    sizes = sorted(set(measured["tree_size"]))
    worst = {name: rows["error"].abs().max() for name, rows in measured.groupby("file")}
    everywhere = "; slower than plain decoding everywhere" if fastest["measured_speedup"] < 1 else ""
    return (
        f"Measured first, on {device} (python -m perfmodel.validate --drafter eagle, {len(worst)} run(s): "
        f"{', '.join(sorted(worst))}): EAGLE-drafted trees of {sizes[0]}-{sizes[-1]} tokens at batches {batches} "
        f"decoded at {slowest['measured_speedup']:.2f}x to {fastest['measured_speedup']:.2f}x plain decoding "
        f"(the fastest: batch {fastest['batch']}, {fastest['tree_size']} tokens{everywhere}). The model "
        "predicted every point within "
        + ", ".join(f"{worst[name]:.1%} ({name})" for name in sorted(worst))
        + ". The predictions below are for this device's own latency source and acceptance."
    )


def drafter_wins_text(chosen: pd.DataFrame, step: str) -> str:
    """Where each drafter is the fastest in simulation (b) for one step flavour (`chosen`:
    perfmodel.planning.drafter_choice.best_drafters), and which drafters never are."""
    rows = chosen[(chosen["simulation"] == "b") & (chosen["step"] == step)].sort_values("batch")
    winners = list(rows["drafter"])
    text = (
        f"{simulations.STEP_LABELS[step].capitalize()}, context {rows['seq_len'].iloc[0]}: the fastest is "
        f"{', '.join(batch_runs(rows['batch'], winners))} (predicted)."
    )
    never = [WINNERS[d] for d in DRAFTER_NAMES if d not in winners]
    if never:
        text += f" Fastest at no batch: {' and '.join(never)}."
    return text


def drafter_sources(drafters: list[Drafter]) -> list[str]:
    """What each drafter's numbers rest on: its acceptance (a preset with its source, or a
    record), its step, and for the draft model where its alpha and cost ratio come from."""
    items = []
    for drafter in drafters:
        said = f"{DRAFTER_NAMES[drafter.name]}: {drafter.describe()}."
        if drafter.name == DrafterKind.DRAFT:
            said += (
                f" Alpha and c are the draft-model comparison's defaults, measured for no pair: alpha "
                f"{drafter.acceptance.alpha:g} is the middle of its {min(DRAFT_ALPHAS):g}-{max(DRAFT_ALPHAS):g}"
                + (
                    f", c = {DEFAULT_DRAFT_COST:g} about a 350M draft for a 7B target (at batch 1 both steps read "
                    "their weights, so c is about the parameter ratio)"
                    if drafter.cost_ratio == DEFAULT_DRAFT_COST
                    else ""
                )
                + "; python -m perfmodel.speedup --drafter all --draft-alpha A --draft-cost C prices others."
            )
        items.append(said)
    return items


def through_origin_text(drafters: list[Drafter]) -> str | None:
    """The caveat of the acceptance presets in use (log curves with no intercept), or None
    where every drafter's curve is a record's or the draft model's."""
    presets = [
        d
        for d in drafters
        if d.choice is not None and d.choice.record is None and getattr(d.choice.curve, "a", None) == 0
    ]
    if not presets:
        return None
    curves = " and ".join(f"{DRAFTER_NAMES[d.name]}'s {d.choice.curve.formula()}" for d in presets)
    one = len(presets) == 1
    return (
        f"{curves} {'is a preset' if one else 'are presets'} through the origin (no intercept): "
        f"{'it keeps' if one else 'they keep'} growing with the tree where measured acceptance saturates, so the "
        "large trees picked at small batches, and their speedups, are optimistic"
        + (
            " (EAGLE's is held to depth + 1 tokens, no more)"
            if any(d.name == DrafterKind.EAGLE for d in presets)
            else ""
        )
        + ". A decoder.measure record replaces a preset with measured tokens per step: "
        "--acceptance-rates FILE (python -m decoder.measure --drafter eagle for EAGLE's, or one the checkpoint "
        "ships)."
    )
