"""A speculation schedule as data: its bands (ScheduleBand), the schedule (SpeculationSchedule),
the settings it may hold (tree families, drafters), and its JSON file: version 2 written,
versions 1 and 2 read (a version-1 band given its drafter, depth and top-k from its paths).
perfmodel.planning.schedule builds one; the floor rule of its lookup is FLOOR_RULE.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance.trees import Tree
from perfmodel.base.drafter_kind import DrafterChoice, DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.drafters import DRAFTERS, KIND_NAMES
from perfmodel.planning.medusa_setting import check_medusa, check_setting


class TreeFamily(StrEnum):
    """What a schedule's trees are: the best tree of each size, or chains of one token per head or pass."""

    TREE = "tree"
    CHAIN = "chain"


FAMILIES = {
    "tree": "the best tree of each size",
    "chain": "one token per Medusa head or EAGLE pass (top-1), as vLLM's Medusa and EAGLE draft",
}
# Who drafts a schedule's bands: one drafter everywhere (perfmodel.planning.drafters), or the best per band.
SCHEDULE_DRAFTERS = {
    "medusa": "the Medusa heads' tree",
    "eagle": "EAGLE's tree (EAGLE-2's top-k expansion: its token budget, depth and top-k)",
    "draft": "a draft model's chain of gamma tokens",
    "eagle3": "EAGLE-3's chain, from its measured per-position acceptance",
    "mtp": "the checkpoint's MTP module(s) drafting a chain, from its measured per-position acceptance",
    "ngram": "n-gram lookup's chain, from its measured per-position acceptance",
    "best": "whichever of medusa, eagle and draft is best in each band, or off",
}
# An off band's drafter: plain decoding drafts nothing, whichever drafter the schedule searched.
OFF = "off"
# Between the drafters' acceptance labels where a schedule searched several (best).
ACCEPTANCE_SEPARATOR = " | "
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
    drafter: str  # a DrafterKind (medusa, eagle, draft, eagle3, mtp, ngram); off (OFF) where it decodes plainly
    # What an engine needs to draft it: depth = the Medusa tree's depth (heads), EAGLE's draft passes, the
    # draft model's gamma; top_k = the widest rank + 1 (Medusa), the nodes each EAGLE pass after the first
    # expands, each into its top-k (EAGLE-2), 1 for a chain; both 0 when off.
    depth: int
    top_k: int

    def __post_init__(self) -> None:
        check_setting(self.drafter, {OFF: "plain decoding"} | KIND_NAMES, "band drafter")
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
    drafter: str = "medusa"  # one of SCHEDULE_DRAFTERS: whose trees (or chains) the bands run
    notes: tuple[str, ...] = ()
    batch_grid: tuple[int, ...] = ()  # the grid the bands were evaluated at
    context_grid: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "medusa", check_medusa(self.medusa))
        check_family(self.family)
        check_drafter(self.drafter)
        if not self.bands:
            raise PerfkitError("a speculation schedule needs at least one band")
        allowed = DRAFTERS if self.drafter == DrafterChoice.BEST else (self.drafter,)
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
        """The drafters its speculating bands run, in DrafterKind's order (none where it is off everywhere)."""
        return tuple(d for d in DrafterKind if any(b.drafter == d for b in self.bands))

    def setting(self) -> str:
        """Who drafts and the speculation setting, in words: 'medusa auto', 'drafter best, speculation auto'."""
        if self.drafter == DrafterKind.MEDUSA:
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


def compact_json(data: dict) -> str:
    """JSON with one key per line and each value on one line, a list of mappings or lists one
    item a line: a schedule (or an engine's table) reads top to bottom, band by band."""

    def value(v) -> str:
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, (dict, list, tuple)) for x in v):
            return "[\n  " + ",\n  ".join(json.dumps(x) for x in v) + "\n ]"
        return json.dumps(v)

    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in data.items()) + "\n}"


def check_family(family: str) -> TreeFamily:
    return TreeFamily(check_setting(family, FAMILIES, "tree family"))


def check_drafter(drafter: str) -> DrafterChoice:
    return DrafterChoice(check_setting(drafter, SCHEDULE_DRAFTERS, "drafter"))
