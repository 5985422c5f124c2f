"""What a report reads besides the device and model: the acceptance behind its speedups
and the closed-loop comparisons (perfmodel.validate) of its device and model.

Acceptance, in order: `--acceptance FILE` (a decoder.measure record), else the record a
checkpoint folder carries (perfmodel.acceptance.record.own_record_path), else the Medusa paper's
acc(n) = 0.477 log2 n for Vicuna-7B (or another preset by name, ACCEPTANCE_PRESETS).
Closed-loop files, in order: `--validation FILE`, else those shipped in
profilers/measurements/<device>/closed-loop/ for the model. Tree ablations (the paper's
Fig. 4, decoder.ablation): `--ablation FILE`, else those shipped in
profilers/measurements/<device>/tree-ablation/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import (
    ACCEPTANCE_PRESETS,
    AcceptanceChoice,
    HeadAccuracyAcceptance,
    drafter_acceptances,
    resolve_acceptance,
)
from perfmodel.acceptance.record import OWN_RECORD_PATTERN, AcceptanceRecord, own_record_path
from perfmodel.acceptance.reference_trees import VICUNA_7B_ORDER, vicuna_7b_prefix
from perfmodel.acceptance.trees import Tree
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.command_tables import read_command_csvs
from perfmodel.models.config import resolve_model_path
from perfmodel.planning.drafters import Drafter, draft_model_drafter, eagle_drafter, medusa_drafter

ABLATION_COLUMNS = (
    "device",
    "model",
    "kind",
    "nodes",
    "predicted_acceptance",
    "measured_acceptance",
    "predicted_speedup",
    "measured_speedup",
)
VALIDATION_COLUMNS = (
    "device",
    "model",
    "tree_size",
    "batch",
    "context",
    "predicted_acceptance",
    "measured_acceptance",
    "predicted_speedup",
    "measured_speedup",
    "error",
)


@dataclass(frozen=True)
class ReportAcceptance:
    choice: AcceptanceChoice  # what the speedups use: the Medusa heads'
    record: AcceptanceRecord | None  # the measured record behind it, if any
    record_path: Path | None
    eagle: AcceptanceChoice | None = None  # an EAGLE record or preset the page was given, for the drafters' section

    @property
    def measured(self) -> bool:
        return self.record is not None


def report_acceptance(acceptance: str | None, model: str) -> ReportAcceptance:
    """`acceptance` (a preset such as "paper", or a record) as
    perfmodel.acceptance.rates.resolve_acceptance reads it; None: the checkpoint's own record, else
    the paper's preset. EAGLE's (its preset or record) prices EAGLE in the drafters' section,
    and the Medusa heads keep the paper's preset."""
    path = None if acceptance in ACCEPTANCE_PRESETS else (Path(acceptance) if acceptance else own_record_path(model))
    given = resolve_acceptance(acceptance if path is None else path)
    if given.drafter != DrafterKind.MEDUSA:  # EAGLE's: the drafters' section prices it; the heads keep their preset
        return ReportAcceptance(resolve_acceptance("paper"), None, None, eagle=given)
    return ReportAcceptance(given, given.record, path)


def own_eagle_record_path(model: str) -> Path | None:
    """The first acceptance-*.json by name in a checkpoint folder that an EAGLE drafter wrote
    (decoder.measure --drafter eagle); None for a model that is not a folder, or without one.
    A file that is no usable record is passed over: the page's own record is checked where it
    is read (report_acceptance)."""
    folder = resolve_model_path(model)
    if folder is None or not folder.is_dir():
        return None
    for path in sorted(folder.glob(OWN_RECORD_PATTERN)):
        try:
            if AcceptanceRecord.load(path).drafter == DrafterKind.EAGLE:
                return path
        except PerfkitError:
            continue
    return None


def report_drafters(acceptance: ReportAcceptance, model: str) -> list[Drafter]:
    """The drafters the page compares (perfmodel.planning.drafters), each with its acceptance
    as perfmodel.acceptance.rates.drafter_acceptances gives it: the page's acceptance goes to
    the drafter it is of (the Medusa heads', or EAGLE's: an EAGLE record or preset), the other
    gets its preset; where the page's is not EAGLE's, an EAGLE record the checkpoint folder
    ships (own_eagle_record_path) is EAGLE's. The draft model: the comparison's alpha and
    cost ratio."""
    choices = drafter_acceptances(acceptance.choice, ["medusa", "eagle"])
    shipped = own_eagle_record_path(model) if acceptance.eagle is None else None
    if acceptance.eagle is not None or shipped is not None:
        choices["eagle"] = acceptance.eagle or resolve_acceptance(shipped)
    return [medusa_drafter(choices["medusa"]), eagle_drafter(choices["eagle"]), draft_model_drafter()]


@dataclass(frozen=True)
class RecommendedTree:
    tree: Tree
    accuracy: np.ndarray | None  # head accuracies that shaped it (None: the reference's own order)
    wanted: int  # the tree size the speedup model asked for
    note: str
    at_edge: bool = False  # wanted is the largest size searched: a bound, a larger tree may do better

    @property
    def wanted_text(self) -> str:
        return f">= {self.wanted}" if self.at_edge else str(self.wanted)


def recommended_tree(size: int, acceptance: ReportAcceptance, at_edge: bool = False) -> RecommendedTree | None:
    """The tree of `size` tokens: from measured head accuracies when there are some, else
    the reference Vicuna-7B tree's own order (its first n-1 nodes), at most its 64 tokens.
    `at_edge`: size is the largest the speedup model searched, so only a lower bound."""
    if size <= 1:
        return None
    heads = acceptance.choice.trees
    if isinstance(heads, HeadAccuracyAcceptance):
        tree = heads.tree(size)
        note = (
            f"The greedy tree of {size} tokens built from the record's measured head accuracies "
            "(paper section 2.3.3); colour = each node's predicted acceptance probability."
        )
        return RecommendedTree(tree, heads.accuracy, size, note, at_edge)
    nodes = min(size - 1, len(VICUNA_7B_ORDER))
    note = (
        f"No measured head accuracies: the first {nodes} nodes of the reference implementation's Vicuna-7B tree, "
        "which lists its nodes most valuable first."
    )
    if size - 1 > nodes:
        at_least = "at least " if at_edge else ""
        searched = " (the largest size it searched)" if at_edge else ""
        note += (
            f" The speedup model's optimum is {at_least}{size} tokens{searched}, "
            "beyond the 64 tokens of that tree: its log acceptance curve keeps "
            "growing with n, real heads saturate. "
            "Measure head accuracies (python -m decoder.measure) and pass --acceptance FILE to shape a larger tree."
        )
    return RecommendedTree(vicuna_7b_prefix(nodes), None, size, note, at_edge)


def load_validation(paths: list[Path], device_key: str, model_name: str, drafter: str = "medusa") -> pd.DataFrame:
    """The closed-loop rows of `paths` that describe this device and model, with trees drafted
    by `drafter` (a run from before the loop had a drafter column drafted with the heads):
    an EAGLE run is no evidence for the heads' trees, nor theirs for EAGLE's."""
    table = read_command_csvs(paths, VALIDATION_COLUMNS, "perfmodel.validate --csv")
    drafted = table["drafter"].fillna("medusa") if "drafter" in table else pd.Series("medusa", index=table.index)
    keep = (table["device"] == device_key) & (table["model"] == model_name) & (drafted == drafter)
    return table[keep].reset_index(drop=True)


def load_ablation(paths: list[Path], device_key: str, model_name: str) -> pd.DataFrame:
    """The tree-ablation rows (decoder.ablation) of this model: this device's where it has
    any, else another device's (tokens per step do not depend on the device; the section says
    whose speedups they are)."""
    table = read_command_csvs(paths, ABLATION_COLUMNS, "python -m decoder.ablation")
    table = table[table["model"] == model_name]
    own = table[table["device"] == device_key]
    if len(own):
        return own.reset_index(drop=True)
    first = sorted(set(table["device"]))[:1]
    return table[table["device"].isin(first)].reset_index(drop=True)
