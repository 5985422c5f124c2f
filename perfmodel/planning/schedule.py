"""A speculation schedule: for one device, model, tensor-parallel degree and acceptance record,
the drafter and tree to run (or "off") for each band of batch size and context length, with
the predicted speedup over plain decoding and what the step times rest on.

Engines load it through perfmodel.planning.engine_exports (vLLM, SGLang, TensorRT-LLM, and
this module's own JSON); `python -m perfmodel.schedule` prints and writes it;
perfmodel.planning.schedule_regret scores it against closed-loop measurements.

The drafter (`drafter=`, perfmodel.planning.drafters): `medusa` (the default) runs the Medusa
heads' trees; `eagle` EAGLE's trees (EAGLE-2's top-k expansion: a budget of n tokens, its depth
and top-k); `draft` a draft model's chain of gamma tokens; `best` whichever of the three is best
in each band, or off. Each drafter is priced by its own step model and acceptance
(Drafter.step, Drafter.acceptance): nothing here prices a step.

How the bands are made:

- The best tree is evaluated at every point of a grid of batches (default: powers of two up
  to 256) x contexts (default 512 to 16384 tokens, those within the model's trained context)
  by the one rule of every best tree (perfmodel.planning.simulations.pick_best: the highest
  speedup, the smaller tree on ties, plain decoding where no tree beats it), per drafter over
  its own sizes. `medusa="on"` takes the best tree of two tokens or more everywhere, even
  where it loses; `"off"` none (the setting applies to whichever drafter runs).
- With `best`, each point runs the drafter whose best tree has the highest speedup there
  (perfmodel.planning.drafter_choice.best_drafters' rule: pick_best again, over the drafters'
  best trees), off where none beats plain decoding.
- The floor rule: grid point g_i stands for the values g_i .. g_(i+1) - 1, the first grid
  point from 1, the last for itself and, on lookup, everything beyond it (an edge band: it
  was not evaluated there). So batch 3 runs the tree of batch 2. Step times grow with batch
  and context, so the floor is the optimistic side: a band's tree is the best at its lowest
  batch and context.
- Adjacent cells with the same drafter and tree merge into one band: along batch within each
  context, then contexts whose batch runs agree. The bands tile the grid as rectangles, no
  gaps and no overlaps (SpeculationSchedule checks it), which is the shape vLLM's (batch x
  context) table takes.
- A band's speedup is the lowest predicted among its grid points (what it can promise); its
  acceptance, the tokens per step of its tree.

The Medusa trees come from the acceptance record's head accuracies (the greedy tree of each
size, perfmodel.acceptance.trees), or without one (the paper's preset) from the reference
implementation's Vicuna-7B tree, whose first n - 1 nodes are its own tree of n tokens: at
most 64 tokens. Sizes no tree of exactly that size exists for, or that need more heads than
the model has, are not searched; the schedule's notes say which. EAGLE's tree is drawn anew
each step (EAGLE-2), so its bands carry its budget, depth and top-k, not paths; a draft
model's band carries its gamma (its depth). A `chain` schedule searches chains of one token
per head (the top-1 of heads 1..k, at most the model's heads) or per EAGLE pass (top-1) instead,
which is all vLLM's Medusa and EAGLE draft by default: its engine export is made from one.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import AcceptanceChoice, HeadAccuracyAcceptance
from perfmodel.acceptance.trees import VICUNA_7B_ORDER, Tree, expected_acceptance, vicuna_7b_prefix
from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.eagle import DraftShape
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.operators import LINEAR_OPS
from perfmodel.planning.capacity import positive_ints
from perfmodel.planning.drafters import (
    DEFAULT_DRAFT_ALPHA,
    DEFAULT_DRAFT_COST,
    DRAFTER_NAMES,
    DRAFTERS,
    Drafter,
    drafters_for,
    eagle_drafter,
)
from perfmodel.planning.medusa_setting import check_medusa, check_setting
from perfmodel.planning.simulations import CANDIDATE_SIZES, pick_best, speedup_table
from perfmodel.planning.step_models import WHOLE_STEP_FLAVORS, check_flavors, flavor_steps

FAMILIES = {
    "tree": "the best tree of each size",
    "chain": "one token per Medusa head or EAGLE pass (top-1), as vLLM's Medusa and EAGLE draft",
}
# Who drafts a schedule's bands: one drafter everywhere (perfmodel.planning.drafters), or the best per band.
SCHEDULE_DRAFTERS = {
    "medusa": "the Medusa heads' tree",
    "eagle": "EAGLE's tree (EAGLE-2's top-k expansion: its token budget, depth and top-k)",
    "draft": "a draft model's chain of gamma tokens",
    "best": "whichever of the three is best in each band, or off",
}
# An off band's drafter: plain decoding drafts nothing, whichever drafter the schedule searched.
OFF = "off"
# Between the drafters' acceptance labels where a schedule searched several (best).
ACCEPTANCE_SEPARATOR = " | "
DEFAULT_MAX_BATCH = 256
DEFAULT_CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384)
FORMAT = "medusa-perfkit speculation schedule"
# 2: bands carry their drafter, depth and top_k; the schedule its drafter setting. 1: Medusa only.
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
FLOOR_RULE = (
    "floor: grid point g_i covers g_i .. g_(i+1) - 1, the first from 1, the last itself and beyond on lookup; "
    "a band's speedup is the lowest predicted at its grid points"
)

Paths = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ScheduleBand:
    batch_min: int
    batch_max: int
    context_min: int
    context_max: int
    tree_size: int  # tokens per step, root included (EAGLE: its token budget); 1 = off (plain decoding)
    paths: Paths  # the Medusa tree's paths (choices); () when off, and for EAGLE (drawn each step) and a draft model
    speedup: float  # predicted vs plain decoding: the lowest at the band's grid points
    acceptance: float  # tokens per step at this tree
    evidence: str  # what the step times rest on: measured | calibrated | grid | borrowed | ceilings | datasheet ...
    drafter: str  # medusa | eagle | draft; off (OFF) where the band decodes plainly
    # What an engine needs to draft it: depth = the Medusa tree's depth (heads), EAGLE's draft passes, the
    # draft model's gamma; top_k = the widest rank + 1 (Medusa), the nodes each EAGLE pass after the first
    # expands, each into its top-k (EAGLE-2), 1 for a chain; both 0 when off.
    depth: int
    top_k: int

    def __post_init__(self) -> None:
        check_setting(self.drafter, {OFF: "plain decoding"} | DRAFTER_NAMES, "band drafter")
        if (self.drafter == OFF) != (self.tree_size == 1):
            raise PerfkitError(
                f"band {self.label()}: drafter {self.drafter!r} with a tree of {self.tree_size} tokens; a band is off "
                "exactly where its tree is 1 token"
            )

    @property
    def speculate(self) -> bool:
        return self.tree_size > 1

    @property
    def draft_tokens(self) -> int:
        """Tokens the drafter proposes per step (the tree's nodes, the root excluded; a draft model's gamma)."""
        return self.tree_size - 1

    @property
    def chain(self) -> bool:
        """One token per depth: the only tree vLLM's Medusa and EAGLE draft (off counts as one)."""
        return self.top_k <= 1

    def label(self) -> str:
        return f"batch {self.batch_min}-{self.batch_max}, context {self.context_min}-{self.context_max}"


@dataclass(frozen=True)
class SpeculationSchedule:
    device: str
    model: str
    tp: int
    dtype: str
    acceptance: str  # what the acceptance model is (its label)
    latency: str  # the latency source's label
    medusa: str  # auto | on | off
    bands: tuple[ScheduleBand, ...]
    medusa_heads: int = 0  # the model's heads (the deepest tree it can run)
    family: str = "tree"  # tree: the best tree of each size; chain: one token per head or pass (vLLM's)
    drafter: str = "medusa"  # medusa | eagle | draft | best (SCHEDULE_DRAFTERS): whose trees the bands run
    notes: tuple[str, ...] = ()
    batch_grid: tuple[int, ...] = ()  # the grid the bands were evaluated at
    context_grid: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_medusa(self.medusa)
        check_family(self.family)
        check_drafter(self.drafter)
        if not self.bands:
            raise PerfkitError("a speculation schedule needs at least one band")
        allowed = DRAFTERS if self.drafter == "best" else (self.drafter,)
        for band in self.bands:
            if band.speculate and band.drafter not in allowed:
                raise PerfkitError(
                    f"band {band.label()} runs {band.drafter!r}; a {self.drafter} schedule runs {', '.join(allowed)}"
                )
        _ = self._cells  # the bands must tile the grid: checked once, here

    @cached_property
    def _cells(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(batch edges, context edges, band index per cell): every band's lower corner is an
        edge, so each cell of the edge grid lies in exactly one band."""
        batch_edges = np.array(sorted({b.batch_min for b in self.bands}), dtype=np.int64)
        context_edges = np.array(sorted({b.context_min for b in self.bands}), dtype=np.int64)
        if batch_edges[0] != 1 or context_edges[0] != 1:
            raise PerfkitError("the schedule's bands must start at batch 1 and context 1")
        index = np.full((len(batch_edges), len(context_edges)), -1, dtype=np.int64)
        top_batch, top_context = max(b.batch_max for b in self.bands), max(b.context_max for b in self.bands)
        for i, band in enumerate(self.bands):
            if band.batch_min > band.batch_max or band.context_min > band.context_max:
                raise PerfkitError(f"band {band.label()} is empty")
            # a band ends where another starts, or at the grid's top: else the values between leave a gap
            if (band.batch_max != top_batch and band.batch_max + 1 not in batch_edges) or (
                band.context_max != top_context and band.context_max + 1 not in context_edges
            ):
                raise PerfkitError(f"band {band.label()} ends where no band starts: the bands leave a gap")
            rows = (batch_edges >= band.batch_min) & (batch_edges <= band.batch_max)
            cols = (context_edges >= band.context_min) & (context_edges <= band.context_max)
            cell = np.ix_(rows, cols)
            if (index[cell] >= 0).any():
                raise PerfkitError(f"band {band.label()} overlaps another band")
            index[cell] = i
        if (index < 0).any():
            b, c = np.argwhere(index < 0)[0]
            raise PerfkitError(
                f"no band covers batch {batch_edges[b]}, context {context_edges[c]}: the bands leave a gap"
            )
        return batch_edges, context_edges, index

    def band_index(self, batch, context) -> np.ndarray:
        """The band of each (batch, context), by the floor rule; beyond the grid, the edge band."""
        batch, context = np.broadcast_arrays(np.asarray(batch), np.asarray(context))
        if (batch < 1).any() or (context < 1).any():
            raise PerfkitError("batch and context must be >= 1")
        batch_edges, context_edges, index = self._cells
        rows = np.searchsorted(batch_edges, batch, side="right") - 1
        cols = np.searchsorted(context_edges, context, side="right") - 1
        return index[rows, cols]

    def tree_size(self, batch, context) -> np.ndarray:
        """The tree size (1 = off) to run at each batch and context; arrays broadcast."""
        sizes = np.array([b.tree_size for b in self.bands], dtype=np.int64)
        return sizes[self.band_index(batch, context)]

    def band(self, batch: int, context: int) -> ScheduleBand:
        return self.bands[int(self.band_index(batch, context))]

    @property
    def evidence(self) -> str:
        return "/".join(dict.fromkeys(b.evidence for b in self.bands))

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters its speculating bands run, in DRAFTERS' order (none where it is off everywhere)."""
        return tuple(d for d in DRAFTERS if any(b.drafter == d for b in self.bands))

    def setting(self) -> str:
        """Who drafts and the speculation setting, in words: 'medusa auto', 'drafter best, speculation auto'."""
        if self.drafter == "medusa":
            return f"medusa {self.medusa}"
        return f"drafter {self.drafter}, speculation {self.medusa}"

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {
                    "batch_min": b.batch_min,
                    "batch_max": b.batch_max,
                    "context_min": b.context_min,
                    "context_max": b.context_max,
                    "tree_size": b.tree_size,
                    "speculate": b.speculate,
                    "draft_tokens": b.draft_tokens,
                    "speedup": b.speedup,
                    "acceptance": b.acceptance,
                    "evidence": b.evidence,
                    "paths": str([list(p) for p in b.paths]),
                    "drafter": b.drafter,
                    "depth": b.depth,
                    "top_k": b.top_k,
                }
                for b in self.bands
            ]
        )

    def to_json(self) -> str:
        """This toolkit's own format: everything the schedule says and what it rests on."""
        head = {"format": FORMAT, "version": FORMAT_VERSION, "rule": FLOOR_RULE}
        return compact_json(head | asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SpeculationSchedule:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PerfkitError(f"not a speculation schedule: invalid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PerfkitError(f'not a speculation schedule (no "format": "{FORMAT}")')
        version = data.get("version")
        if version not in READ_VERSIONS:
            raise PerfkitError(
                f"speculation schedule version {version!r}; this reads {', '.join(map(str, READ_VERSIONS))}"
            )
        try:
            bands = tuple(ScheduleBand(**band_fields(band, version)) for band in data["bands"])
            fields = {k: data[k] for k in ("device", "model", "tp", "dtype", "acceptance", "latency", "medusa")}
            extra = {k: tuple(data.get(k, ())) for k in ("notes", "batch_grid", "context_grid")}
            heads, family = int(data.get("medusa_heads", 0)), data.get("family", "tree")
            drafter = data.get("drafter", "medusa")  # version 1 schedules are all Medusa's
            return cls(**fields, bands=bands, medusa_heads=heads, family=family, drafter=drafter, **extra)
        except (KeyError, TypeError, ValueError) as exc:
            raise PerfkitError(f"not a usable speculation schedule ({type(exc).__name__}: {exc})") from None

    @classmethod
    def load(cls, path: str | Path) -> SpeculationSchedule:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise PerfkitError(f"cannot read schedule {path}: {exc.strerror or exc}") from None
        return cls.from_json(text)


def band_fields(band: dict, version: int) -> dict:
    """A band of a schedule's JSON as ScheduleBand's fields: paths as tuples; a version-1 band
    (Medusa's, or off) given its drafter, depth and top-k from its paths."""
    fields = {**band, "paths": tuple(tuple(int(r) for r in p) for p in band["paths"])}
    if version == 1:
        tree = Tree(fields["paths"])
        speculate = int(band["tree_size"]) > 1
        fields |= {"drafter": "medusa" if speculate else OFF, "depth": tree.depth, "top_k": tree.max_rank + 1}
    return fields


# ----------------------------------------------------------------------------- building


def compact_json(data: dict) -> str:
    """JSON with one key per line and each value on one line, a list of mappings or lists one
    item a line: a schedule (or an engine's table) reads top to bottom, band by band."""

    def value(v) -> str:
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, (dict, list, tuple)) for x in v):
            return "[\n  " + ",\n  ".join(json.dumps(x) for x in v) + "\n ]"
        return json.dumps(v)

    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in data.items()) + "\n}"


def check_family(family: str) -> str:
    return check_setting(family, FAMILIES, "tree family")


def check_drafter(drafter: str) -> str:
    return check_setting(drafter, SCHEDULE_DRAFTERS, "drafter")


@dataclass(frozen=True)
class TreeBook:
    """The tree of each size the schedule may choose, its tokens per step (the acceptance the
    speedups use), and why other sizes were left out. Called with sizes, it is that acceptance."""

    trees: dict[int, Tree] = field(default_factory=dict)  # size > 1 -> tree
    accepted: dict[int, float] = field(default_factory=dict)  # size > 1 -> tokens per step
    notes: tuple[str, ...] = ()

    def __call__(self, n) -> np.ndarray:
        n = np.asarray(n)
        flat = [self.accepted.get(int(x), 1.0) for x in np.ravel(n)]
        return np.asarray(flat, dtype=float).reshape(n.shape)


def tree_book(choice: AcceptanceChoice, sizes, heads: int, family: str = "tree") -> TreeBook:
    """The trees of `sizes` (root included) and their acceptance. family tree: the greedy tree
    of the record's head accuracies, else the reference's Vicuna-7B tree's prefix, at the
    acceptance model's tokens per step; a size without a tree of exactly that many tokens, or
    deeper than the model's `heads`, is left out (with a note). family chain (`sizes` unused):
    the chains of 1 to `heads` nodes, at their expected acceptance from the head accuracies (without them,
    the acceptance model's, which was fitted to trees: an upper bound for a chain)."""
    shaper = choice.trees if isinstance(choice.trees, HeadAccuracyAcceptance) else None
    if check_family(family) == "chain":
        # every chain the heads (and the record's heads) reach: `sizes` is about trees
        depth = heads if shaper is None else min(heads, shaper.accuracy.shape[0])
        trees = {n: Tree(tuple((0,) * d for d in range(1, n))) for n in range(2, depth + 2)}
        if shaper is not None:
            accepted = {n: expected_acceptance(tree, shaper.accuracy) for n, tree in trees.items()}
            notes = ["chains: one token per head (top-1), as vLLM's Medusa drafts; acceptance from the head accuracies"]
        else:
            accepted = {n: float(choice.model(n)) for n in trees}
            notes = [
                "chains: one token per head, as vLLM's Medusa drafts; no head accuracies, so a chain is credited the "
                "acceptance curve's tokens per step at its size, a curve of trees of 16-64 tokens that says little of "
                "2-5 token chains (measure the heads: python -m decoder.measure)"
            ]
        return TreeBook(trees, accepted, tuple(notes))
    trees, missing, deep = {}, [], []
    for n in sorted(int(s) for s in sizes if s > 1):
        if shaper is not None:
            tree = shaper.tree(n)
        elif n - 1 <= len(VICUNA_7B_ORDER):
            tree = vicuna_7b_prefix(n - 1)
        else:
            missing.append(n)
            continue
        if tree.size != n:
            missing.append(n)
        elif tree.depth > heads:
            deep.append(n)
        else:
            trees[n] = tree
    notes = []
    if shaper is None:
        notes.append(
            "no measured head accuracies: each tree is the reference Vicuna-7B tree's first n - 1 nodes "
            "(python -m decoder.measure and --acceptance-rates FILE shape trees from the heads themselves)"
        )
    if missing:
        notes.append(f"tree sizes {', '.join(map(str, missing))} not searched: no tree of exactly that size to run")
    if deep:
        notes.append(f"tree sizes {', '.join(map(str, deep))} not searched: deeper than the model's {heads} heads")
    kept = np.array(list(trees), dtype=np.int64)
    accepted = dict(zip(trees, np.asarray(choice.model(kept), dtype=float).tolist())) if trees else {}
    return TreeBook(trees, accepted, tuple(notes))


def step_evidence(step) -> str:
    """What a step model's times rest on: its latency source's mode, where `measured` holds
    only if every linear op of the (shard) model was measured, else `calibrated`."""
    latency = getattr(getattr(step, "shard_step", step), "latency", None)
    mode = getattr(latency, "mode", None)
    if mode is None:
        return "unknown"
    if mode == "measured" and any(latency.linear_kind(op) != "measured" for op in LINEAR_OPS):
        return "calibrated"
    return mode


def view_evidence(view, step) -> str:
    """step_evidence, where a CPU's roofline says `ceilings`: it has no datasheet, its
    roofline is its own measured ceilings."""
    evidence = step_evidence(step)
    return "ceilings" if view.is_cpu and evidence == "datasheet" else evidence


def default_batches(max_batch: int = DEFAULT_MAX_BATCH) -> np.ndarray:
    """Every power of two up to max_batch, and max_batch itself."""
    powers = 2 ** np.arange(int(np.log2(max_batch)) + 1)
    return np.union1d(powers, [max_batch]).astype(np.int64)


def default_contexts(max_context: int | None) -> np.ndarray:
    """DEFAULT_CONTEXTS within the model's trained context (that context itself where it is
    shorter than the first)."""
    if max_context is None:
        return np.array(DEFAULT_CONTEXTS, dtype=np.int64)
    kept = [c for c in DEFAULT_CONTEXTS if c <= max_context]
    return np.array(kept or [max_context], dtype=np.int64)


def best_cells(table: pd.DataFrame, medusa: str) -> pd.DataFrame:
    """The chosen row per (batch, seq_len): pick_best among the sizes `medusa` allows, in
    (batch, seq_len) order."""
    eligible = None if medusa == "auto" else (table["tree_size"] > 1 if medusa == "on" else table["tree_size"] == 1)
    if medusa == "on" and not eligible.any():
        eligible = None  # nothing but plain decoding to choose from (a model without heads)
    best = pick_best(table, eligible=eligible)
    return best.sort_values(["batch", "seq_len"], kind="stable").reset_index(drop=True)


def grid_ranges(grid: np.ndarray) -> list[tuple[int, int]]:
    """The floor rule: (low, high) each grid point stands for."""
    lows = [1, *grid[1:].tolist()]
    highs = [*(grid[1:] - 1).tolist(), int(grid[-1])]
    return list(zip(lows, highs))


def runs(values: list) -> list[tuple[int, int]]:
    """(first, last) index of each run of equal consecutive values."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            out.append((start, i - 1))
            start = i
    return out


Choice = tuple[str, int]  # what a cell runs: (drafter or OFF, tree size)


def merge_bands(
    chosen: list[list[Choice]], speedups: np.ndarray, batches, contexts, drafted: dict[Choice, dict], evidence: str
) -> list[ScheduleBand]:
    """Bands from the grid's (batch x context) choices: runs of one drafter and tree along
    batch per context, then neighbouring contexts with the same runs merged. drafted: each
    choice's band fields (drafted_fields)."""
    batch_span, context_span = grid_ranges(batches), grid_ranges(contexts)
    columns = [tuple((a, b, chosen[a][c]) for a, b in runs([row[c] for row in chosen])) for c in range(len(contexts))]
    bands = []
    for first, last in runs(columns):
        for a, b, choice in columns[first]:
            bands.append(
                ScheduleBand(
                    batch_span[a][0],
                    batch_span[b][1],
                    context_span[first][0],
                    context_span[last][1],
                    speedup=float(speedups[a : b + 1, first : last + 1].min()),
                    evidence=evidence,
                    **drafted[choice],
                )
            )
    return bands


def drafted_fields(drafter: Drafter | None, size: int) -> dict:
    """The band fields of `drafter`'s tree of `size` tokens (None or size 1: off): the tree, the
    drafter, what an engine needs to draft it (ScheduleBand's depth and top_k) and its tokens
    per step. A Medusa drafter's acceptance is its TreeBook, which holds the tree."""
    if drafter is None or size == 1:
        return dict(tree_size=1, paths=(), acceptance=1.0, drafter=OFF, depth=0, top_k=0)
    if drafter.name == "medusa":
        tree = drafter.acceptance.trees[size]
        shape = dict(paths=tree.paths, depth=tree.depth, top_k=tree.max_rank + 1)
    elif drafter.name == "eagle":
        # the width of EAGLE's last pass: the nodes every pass after the first expands (DraftShape)
        passes = drafter.shape.pass_tokens(size)
        shape = dict(paths=(), depth=len(passes), top_k=int(passes[-1]))
    else:  # a draft model drafts a chain of gamma = size - 1 tokens
        shape = dict(paths=(), depth=size - 1, top_k=1)
    return dict(tree_size=size, acceptance=float(drafter.acceptance(size)), drafter=drafter.name, **shape)


EAGLE_CHAIN_NOTE = (
    "EAGLE chains: one token per draft pass (top-1), as vLLM's EAGLE drafts; a chain is credited the EAGLE "
    "curve's tokens per step at its size, a curve of trees that says little of chains"
)


def searched_drafters(
    drafter: str, acceptance, model: ModelConfig, sizes: np.ndarray, family: str, alpha: float, cost_ratio: float
) -> tuple[list[Drafter], list[str]]:
    """The drafters a schedule of `drafter` searches (all three for best; drafters_for, which
    refuses an acceptance of another drafter), each with the sizes searched (Drafter.sizes,
    root included), and the notes on what was left out. Medusa's acceptance becomes its
    TreeBook (the trees of `sizes`, or its chains), EAGLE's chain family drafts top-1 up to its
    depth; EAGLE's trees are searched over `sizes`, the draft model over its own gammas."""
    several = drafter == "best"
    out, notes = [], []
    for found in drafters_for("all" if several else drafter, acceptance, alpha, cost_ratio):
        if found.name == "medusa":
            if model.medusa_heads:
                book = tree_book(found.choice, sizes[sizes > 1], model.medusa_heads, family)
                notes += book.notes
            else:
                book = TreeBook()
                notes.append(
                    f"{model.name} has no Medusa heads: "
                    + ("Medusa is not searched" if several else "plain decoding everywhere")
                )
            found = dataclasses.replace(found, acceptance=book, sizes=(1, *sorted(book.trees)))
        elif found.name == "eagle" and family == "chain":
            shape = DraftShape(found.shape.depth, top_k=1)
            found = dataclasses.replace(eagle_drafter(found.choice, shape), sizes=tuple(range(1, shape.depth + 2)))
            notes.append(EAGLE_CHAIN_NOTE)
        elif found.name == "eagle":
            found = dataclasses.replace(found, sizes=tuple(int(n) for n in np.union1d(sizes, [1])))
        out.append(found)
    return out, notes


def edge_note(drafter: Drafter, cells: pd.DataFrame, family: str, named: bool) -> list[str]:
    """The note where a drafter's best tree is somewhere the largest it searched (a bound: a
    larger one may do better); a chain family's Medusa and EAGLE chains end at their depth."""
    top = max(drafter.sizes)
    if len(drafter.sizes) <= 2 or not (cells["tree_size"] == top).any():
        return []
    if drafter.name == "draft":
        text = f"the longest draft searched (gamma {top - 1}) is the best somewhere: a longer one may do better"
    elif family == "tree":
        text = f"the largest tree searched ({top} tokens) is the best somewhere: a larger one may do better"
    else:
        return []
    # beside other drafters, its own best: the schedule may run another drafter there
    return [f"{DRAFTER_NAMES[drafter.name]}: {text.replace(' is the best', ' is its best')}" if named else text]


def acceptance_label(drafters: list[Drafter]) -> str:
    """What each drafter's acceptance (and, EAGLE's and a draft model's, its shape) assumes."""
    if len(drafters) == 1:
        return drafters[0].describe()
    return ACCEPTANCE_SEPARATOR.join(f"{DRAFTER_NAMES[d.name]}: {d.describe()}" for d in drafters)


def build_schedule(
    step,
    acceptance_choice=None,
    batches=None,
    contexts=None,
    sizes=CANDIDATE_SIZES,
    medusa: str = "auto",
    *,
    model: ModelConfig | None = None,
    device: str = "",
    dtype: str = "",
    tp: int = 1,
    evidence: str | None = None,
    family: str = "tree",
    drafter: str = "medusa",
    alpha: float = DEFAULT_DRAFT_ALPHA,
    cost_ratio: float = DEFAULT_DRAFT_COST,
) -> SpeculationSchedule:
    """The schedule of one step model (perfmodel.planning.step_models.flavor_steps: the shard
    and its all-reduces) and acceptance (anything resolve_acceptance reads; None: each
    drafter's preset). batches, contexts: the grid (None: default_batches(),
    default_contexts(the model's context)). sizes: tree sizes to search, root included (1 is
    always among them; Medusa's and EAGLE's, the draft model searches gamma 1..8). model: the
    whole model (its name and heads; default the step's). evidence: what the step times rest on
    (default step_evidence(step)). family: tree (the best tree of each size) or chain (one
    token per head or EAGLE pass, the trees vLLM drafts). drafter: medusa, eagle, draft or best
    (SCHEDULE_DRAFTERS); alpha and cost_ratio: the draft model's (perfmodel.planning.drafters)."""
    medusa, family, drafter = check_medusa(medusa), check_family(family), check_drafter(drafter)
    model = model or getattr(getattr(step, "shard_step", step), "model", None)
    if model is None:
        raise PerfkitError("build_schedule needs the model (its heads and name): pass model=")
    batches = default_batches() if batches is None else positive_ints(batches, "batches")
    contexts = default_contexts(model.max_context) if contexts is None else positive_ints(contexts, "contexts")
    sizes = positive_ints(sizes, "tree sizes")
    drafters, notes = searched_drafters(drafter, acceptance_choice, model, sizes, family, alpha, cost_ratio)
    cells = []
    for searched in drafters:
        table = speedup_table(searched.step(step), searched.acceptance, batches, contexts, searched.sizes)
        cells.append(best_cells(table, medusa).assign(drafter=searched.name))
        notes += edge_note(searched, cells[-1], family, len(drafters) > 1)
    # the drafter whose best tree is fastest per point: pick_best once more, over the drafters' best cells
    best = best_cells(pd.concat(cells, ignore_index=True), medusa)
    by_name = {d.name: d for d in drafters}
    choices = [(d if n > 1 else OFF, int(n)) for d, n in zip(best["drafter"], best["tree_size"])]
    drafted = {c: drafted_fields(by_name.get(c[0]), c[1]) for c in choices}
    shape = (len(batches), len(contexts))  # best is in (batch, seq_len) order: batch-major, then context
    chosen = [choices[i * shape[1] : (i + 1) * shape[1]] for i in range(shape[0])]
    gains = best["speedup"].to_numpy().reshape(shape)
    if model.max_context and contexts.max() > model.max_context:
        notes.append(f"contexts beyond {model.name}'s {model.max_context}-token context are priced as if it ran there")
    bands = merge_bands(chosen, gains, batches, contexts, drafted, evidence or step_evidence(step))
    return SpeculationSchedule(
        device=device,
        model=model.name,
        tp=int(tp),
        dtype=dtype,
        acceptance=acceptance_label(drafters),
        latency=getattr(step, "label", ""),
        medusa=medusa,
        bands=tuple(bands),
        medusa_heads=model.medusa_heads,
        family=family,
        drafter=drafter,
        notes=tuple(notes),
        batch_grid=tuple(int(b) for b in batches),
        context_grid=tuple(int(c) for c in contexts),
    )


def speculation_schedule(
    model,
    device,
    tp: int = 1,
    dtype: str | None = None,
    acceptance=None,
    latency: str = "auto",
    step: str = "full",
    tracer=None,
    batches=None,
    contexts=None,
    medusa: str = "auto",
    sizes=CANDIDATE_SIZES,
    family: str = "tree",
    drafter: str = "medusa",
    alpha: float = DEFAULT_DRAFT_ALPHA,
    cost_ratio: float = DEFAULT_DRAFT_COST,
) -> SpeculationSchedule:
    """The schedule of `model` (preset, config.json or ModelConfig) split `tp` ways on `device`
    (a name, spec file or DeviceView; cpu: this machine's CPU), priced by the whole-model step
    (step "full", or "traced" with the decoder's tracer) from the device's latency source
    (perfmodel.latency.source: auto = measured where it was measured). acceptance: a preset
    or a decoder.measure record (resolve_acceptance; None: each drafter's preset, the paper's
    for Medusa, EAGLE-2's for EAGLE). dtype None: the device's default. family, drafter, alpha
    and cost_ratio: build_schedule's (chain for vLLM's Medusa and EAGLE)."""
    check_medusa(medusa)
    check_family(family)
    check_drafter(drafter)
    check_flavors([step], WHOLE_STEP_FLAVORS)
    model = model if isinstance(model, ModelConfig) else load_model(model)
    view = resolve_devices([device])[0]
    dtype = check_dtype(dtype) if dtype else default_dtype(view)
    steps = flavor_steps(view, model, dtype, tp, latency, (step,), tracer)
    evidence = view_evidence(view, steps[step])
    return build_schedule(
        steps[step],
        acceptance,
        batches,
        contexts,
        sizes,
        medusa,
        model=model,
        device=view.spec.key,
        dtype=dtype,
        tp=tp,
        evidence=evidence,
        family=family,
        drafter=drafter,
        alpha=alpha,
        cost_ratio=cost_ratio,
    )
