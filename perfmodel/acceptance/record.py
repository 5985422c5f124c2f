"""The acceptance record: what `python -m decoder.measure` writes (JSON) and a checkpoint
folder may carry beside its weights, typed.

`AcceptanceRecord.load(path)` is its one reader: it checks what the readers use (the
measured tokens per step per tree size, the heads' top-k accuracies, and the run's
settings where given) and says in one line, naming the file, what is wrong.
`own_record_path(model)` is the one rule for a checkpoint folder's own record:
acceptance-greedy.json (greedy acceptance is lossless), else the first other
acceptance-*.json by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perfmodel.base.checks import is_integer, is_real
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.models.config import resolve_model_path

# Who drafted the trees a record measured: the Medusa heads, or an EAGLE drafter (decoder.eagle).
RECORD_DRAFTERS = (DrafterKind.MEDUSA, DrafterKind.EAGLE)
OWN_RECORD_PATTERN = "acceptance-*.json"
PREFERRED_RECORD = "acceptance-greedy.json"
WRITER = "python -m decoder.measure"


@dataclass(frozen=True)
class TreeSizeRun:
    """One tree size's run in a record: tokens accepted per step, root included."""

    tree_size: int
    mean_accepted_tokens: float
    # per prompt, per step: tokens of the accepted path, root included, before the cut at the
    # token budget (what a performance twin replays, decoder.twin); None in older records
    path_lengths: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class AcceptanceRecord:
    """A decoder.measure record. Values keep the types the JSON gave them, so what is
    computed from them is what was computed from the file before it was typed. The
    settings are None where the record does not give them; `data` is the whole record, as
    written (to_dict)."""

    per_tree_size: tuple[TreeSizeRun, ...]
    head_topk_accuracy: tuple[tuple[float, ...], ...]  # (heads, top-k): a_k^(i); () in an EAGLE record without them
    drafter: str = "medusa"  # RECORD_DRAFTERS; records written before the field are Medusa's
    model: str | None = None
    scheme: str | None = None  # the acceptance scheme: greedy, typical or rejection
    tree_name: str | None = None
    tree_size: int | None = None  # tokens of the run's own tree, root included
    batch: int | None = None
    prompts: int | None = None
    new_tokens_per_prompt: int | None = None
    mean_accepted_tokens: float | None = None  # with the run's own tree
    lossless: bool | None = None
    accepted_length_histogram: dict = field(default_factory=dict)  # tokens accepted -> steps
    data: dict = field(default_factory=dict, repr=False)
    path: Path | None = None

    @property
    def accuracy(self) -> np.ndarray:
        return np.asarray(self.head_topk_accuracy, dtype=float)

    @property
    def tree_sizes(self) -> list[int]:
        return [run.tree_size for run in self.per_tree_size]

    @property
    def tokens_per_step(self) -> list[float]:
        return [run.mean_accepted_tokens for run in self.per_tree_size]

    def to_dict(self) -> dict:
        return self.data

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceRecord:
        path = Path(path)
        return cls.from_dict(read_json(path, "acceptance record"), path)

    @classmethod
    def from_dict(cls, data: object, path: str | Path | None = None) -> AcceptanceRecord:
        """A record from its JSON object; `path` names it in errors (and is kept)."""
        source = path if path is not None else "acceptance record"
        if not isinstance(data, dict):
            raise PerfkitError(f"{source}: expected a JSON object written by {WRITER}")

        def bad(what: str) -> PerfkitError:
            return PerfkitError(f"{source}: not a usable decoder.measure record ({what})")

        drafter = _optional(data, "drafter", TEXT, bad) or DrafterKind.MEDUSA
        if drafter not in RECORD_DRAFTERS:
            raise bad(f"drafter must be one of {', '.join(RECORD_DRAFTERS)}, got {drafter!r}")
        drafter = DrafterKind(drafter)
        # Head accuracies shape Medusa's trees; an EAGLE run has no heads to score.
        required = ("per_tree_size", "head_topk_accuracy") if drafter == DrafterKind.MEDUSA else ("per_tree_size",)
        for key in required:
            if key not in data:
                raise PerfkitError(f"{source}: missing {key!r}; write it with {WRITER}")

        runs = data["per_tree_size"]
        if not isinstance(runs, list) or not runs:
            raise bad("per_tree_size must be a non-empty list of runs")
        per_tree_size = []
        for i, run in enumerate(runs):
            if not isinstance(run, dict) or "tree_size" not in run or "mean_accepted_tokens" not in run:
                raise bad(f"per_tree_size[{i}] needs tree_size and mean_accepted_tokens")
            size, tokens = run["tree_size"], run["mean_accepted_tokens"]
            if not is_integer(size) or size < 1 or not is_real(tokens, finite=False):
                raise bad(f"per_tree_size[{i}]: tree_size {size!r} must be an integer >= 1, tokens {tokens!r} a number")
            lengths = run.get("path_lengths")
            if lengths is not None and not (
                isinstance(lengths, list)
                and all(isinstance(r, list) and r and all(is_integer(n) and 1 <= n <= size for n in r) for r in lengths)
            ):
                raise bad(
                    f"per_tree_size[{i}]: path_lengths must be lists (one per prompt) of integers from 1 to the "
                    f"tree size {size}"
                )
            paths = tuple(tuple(r) for r in lengths) if lengths is not None else None
            per_tree_size.append(TreeSizeRun(size, tokens, paths))
        check_acceptance_grows(per_tree_size, bad)
        accuracy = data.get("head_topk_accuracy")
        rows = accuracy if isinstance(accuracy, list) and accuracy else [None]
        if accuracy is None and drafter != DrafterKind.MEDUSA:
            rows = []
        elif not all(isinstance(r, list) and r and len(r) == len(rows[0]) for r in rows) or not all(
            is_real(a, finite=False) and 0 <= a <= 1 for r in rows for a in r
        ):
            raise bad("head_topk_accuracy must be a (heads, top-k) list of lists of probabilities in [0, 1]")
        tree = _optional(data, "tree", OBJECT, bad) or {}
        return cls(
            per_tree_size=tuple(per_tree_size),
            head_topk_accuracy=tuple(tuple(r) for r in rows),
            drafter=drafter,
            model=_optional(data, "model", TEXT, bad),
            scheme=_optional(_optional(data, "acceptance", OBJECT, bad) or {}, "scheme", TEXT, bad),
            tree_name=_optional(tree, "name", TEXT, bad),
            tree_size=_optional(tree, "size", INTEGER, bad),
            batch=_optional(data, "batch", INTEGER, bad),
            prompts=_optional(data, "prompts", INTEGER, bad),
            new_tokens_per_prompt=_optional(data, "new_tokens_per_prompt", INTEGER, bad),
            mean_accepted_tokens=_optional(data, "mean_accepted_tokens", NUMBER, bad),
            lossless=_optional(data, "lossless", TRUTH, bad),
            accepted_length_histogram=_optional(data, "accepted_length_histogram", OBJECT, bad) or {},
            data=data,
            path=Path(path) if path is not None else None,
        )


# How far tokens per step may fall from one tree size to a larger one before a record is refused:
# decoder.measure's trees of a run are nested (a larger one holds the smaller), so a greedy
# step accepts at least as much with the larger; sampled schemes add some noise.
ACCEPTANCE_DROP = 0.05


def check_acceptance_grows(runs, bad) -> None:
    """Tokens per step are finite, at least 1 (the root is always accepted) and, beyond
    noise, do not fall as the tree grows: a curve that does would fit no acceptance model
    (its log fit explains less than a constant) and would be taken silently."""
    for run in runs:
        if not math.isfinite(run.mean_accepted_tokens) or run.mean_accepted_tokens < 1:
            raise bad(f"tree size {run.tree_size}: mean_accepted_tokens {run.mean_accepted_tokens!r} must be >= 1")
    ordered = sorted(runs, key=lambda run: run.tree_size)
    for small, large in zip(ordered, ordered[1:]):
        if large.mean_accepted_tokens < (1 - ACCEPTANCE_DROP) * small.mean_accepted_tokens:
            raise bad(
                f"tokens per step fall from {small.mean_accepted_tokens:g} at tree size {small.tree_size} to "
                f"{large.mean_accepted_tokens:g} at {large.tree_size}: a larger tree holds the smaller one and cannot "
                "accept fewer; the record is damaged or mixes runs"
            )


# What an optional setting must be: a test of its value, and how an error says it.
INTEGER = (is_integer, "an integer")
NUMBER = (lambda v: is_real(v, finite=False), "a number")
TEXT = (lambda v: isinstance(v, str), "a string")
OBJECT = (lambda v: isinstance(v, dict), "a JSON object")
TRUTH = (lambda v: isinstance(v, bool), "true or false")


def _optional(data: dict, key: str, kind: tuple, bad):
    """data[key] where it is of `kind` (None where absent or null); an error otherwise."""
    value = data.get(key)
    test, text = kind
    if value is not None and not test(value):
        raise bad(f"{key} must be {text}, got {value!r}")
    return value


def own_record_path(model: str | Path) -> Path | None:
    """A checkpoint folder's own acceptance record (`model`: a folder, or a name such as
    `bundled`): acceptance-greedy.json, else the first acceptance-*.json by name; None for
    a model that is not a folder, or a folder without one."""
    folder = resolve_model_path(model)
    if folder is None or not folder.is_dir():
        return None
    records = sorted(folder.glob(OWN_RECORD_PATTERN), key=lambda p: (p.name != PREFERRED_RECORD, p.name))
    return records[0] if records else None


def own_record(model: str | Path) -> AcceptanceRecord | None:
    """The checkpoint folder's own record (own_record_path), loaded; None without one."""
    path = own_record_path(model)
    return None if path is None else AcceptanceRecord.load(path)
