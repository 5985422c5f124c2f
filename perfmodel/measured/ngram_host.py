"""What n-gram (prompt-lookup) drafting costs the host, as measured: its drafting runs no
GPU work, only a lookup in each sequence's token history per step, on the host's CPU.

`python -m profilers.ngram_lookup` times a real proposer (decoder.ngram) on this host and
writes a CSV of median seconds per sequence per step by context length and k (the tokens
proposed), with its metadata beside it (FILE.meta.json). The CSV's columns and the
metadata's keys are defined here, once, for that writer and this reader.

Stored files live at `<root>/<host key>/ngram-lookup/ngram-lookup.csv` of each measurement
root (perfmodel.measured.store.measurement_roots: the user's home first, then the shipped
folder); `--store` puts a run there. `ngram_host_cost()` reads this host's file (its CPU key,
perfmodel.hardware.cpu_identity), else the first stored, its label saying whose.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.cpu_identity import this_cpu_key
from perfmodel.measured.store import measurement_roots, read_meta

COMMAND = "python -m profilers.ngram_lookup"
# The n-grams looked up, shortest and longest (vLLM's prompt_lookup_min and prompt_lookup_max): a
# usual prompt-lookup range (vLLM's own default is 5-grams only, decoder.ngram), the profiler's
# default, and the range the engine exports state, so an export runs the lookup that was measured.
LOOKUP_N = (2, 5)
FOLDER = "ngram-lookup"
FILE_NAME = "ngram-lookup.csv"

# The CSV's columns: one row per (context, k) point, every row of one (min_n, max_n).
CONTEXT = "context"  # tokens in each history looked up
K = "k"  # tokens proposed at most
MIN_N, MAX_N = "min_n", "max_n"  # the n-gram lengths looked for
SECONDS_MEDIAN = "seconds_median"  # seconds per sequence per step, median over the timed calls
SECONDS_P90 = "seconds_p90"  # ... their 90th percentile
CALLS = "calls"  # timed calls (decoding steps), each over a batch of histories
MATCHED_SHARE = "matched_share"  # share of the lookups that proposed at least one token
COLUMNS = (CONTEXT, K, MIN_N, MAX_N, SECONDS_MEDIAN, SECONDS_P90, CALLS, MATCHED_SHARE)

# The metadata's keys this reader uses (the writer adds more: versions, the text used).
META_CPU = "cpu_model"
META_HOST = "host"  # the CPU key it was measured on
META_MEASURED = "measured"  # UTC, ISO 8601


def stored_ngram_lookups(roots: list[Path] | None = None) -> list[Path]:
    """Every stored n-gram lookup CSV, the user's before the shipped."""
    return [path for root in roots or measurement_roots() for path in sorted(root.glob(f"*/{FOLDER}/{FILE_NAME}"))]


def _shown(path: Path) -> str:
    """A file as a label names it: <host key>/ngram-lookup/ngram-lookup.csv where stored."""
    return "/".join(path.parts[-3:]) if path.parent.name == FOLDER else path.name


def _read_table(path: Path) -> pd.DataFrame:
    try:
        table = pd.read_csv(path)
    except FileNotFoundError:
        raise PerfkitError(f"{path}: no such file (`{COMMAND}` writes one)") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"{path}: not a CSV table ({str(exc).splitlines()[0]})") from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise PerfkitError(
            f"{path}: no column {', '.join(missing)}, so not a table of `{COMMAND}`; its columns are "
            f"{', '.join(COLUMNS)}"
        )
    numbers_ = table[list(COLUMNS)].apply(pd.to_numeric, errors="coerce")
    bad = numbers_.isna().any(axis=1) | ~np.isfinite(numbers_).all(axis=1)
    bad |= (numbers_[[CONTEXT, K, MIN_N, MAX_N]] < 1).any(axis=1) | (numbers_[SECONDS_MEDIAN] <= 0)
    if bad.any():
        line = int(table.index[bad][0]) + 2  # the header is line 1
        raise PerfkitError(
            f"{path}: line {line} is not a measured point (counts >= 1 and seconds > 0, all numbers); measure again "
            f"with `{COMMAND}`"
        )
    if numbers_.empty:
        raise PerfkitError(f"{path}: no rows; measure again with `{COMMAND}`")
    return numbers_


def _grid(table: pd.DataFrame, path: Path) -> tuple[tuple[int, ...], tuple[int, ...], np.ndarray]:
    """(contexts, ks, seconds per sequence as a contexts x ks array) of a checked table."""
    settings = table[[MIN_N, MAX_N]].drop_duplicates()
    if len(settings) > 1:
        raise PerfkitError(
            f"{path}: rows of {len(settings)} n-gram settings (min_n, max_n); a file holds one run's: measure each "
            "setting into a file of its own"
        )
    table = table.astype({CONTEXT: np.int64, K: np.int64})
    if table.duplicated([CONTEXT, K]).any():
        raise PerfkitError(f"{path}: a (context, k) point has two rows; a file holds one run's, measure again")
    grid = table.pivot(index=CONTEXT, columns=K, values=SECONDS_MEDIAN).sort_index().sort_index(axis=1)
    if grid.isna().any().any():
        context, k = next((c, k) for c in grid.index for k in grid.columns if math.isnan(grid.at[c, k]))
        raise PerfkitError(f"{path}: no row for context {context} and k {k}: every context needs every k measured")
    return tuple(int(c) for c in grid.index), tuple(int(k) for k in grid.columns), grid.to_numpy(dtype=float)


def _number(value: object, least: float, what: str, integer: bool) -> float:
    ok = isinstance(value, numbers.Integral) if integer else isinstance(value, numbers.Real)
    if isinstance(value, bool) or not ok or not math.isfinite(float(value)) or float(value) < least:
        kind = "an integer" if integer else "a number"
        raise PerfkitError(f"n-gram host cost: {what} must be {kind} >= {least:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class NgramHostCost:
    """Measured seconds of n-gram lookup per sequence per step on one host, on a grid of
    context lengths x k; seconds() prices a batch's step."""

    contexts: tuple[int, ...]
    ks: tuple[int, ...]
    per_sequence_s: tuple[tuple[float, ...], ...]  # [context][k]: median seconds per sequence per step
    min_n: int
    max_n: int
    cpu: str
    host: str
    source: str  # the file, as labels name it
    measured: str  # the UTC date of the measurement
    stands_in_for: str = ""  # the host it prices where that host has none of its own

    def seconds(self, batch: int, context: float, k: int) -> float:
        """Host seconds of one step's lookups for `batch` sequences of `context` tokens
        proposing up to k each: batch x the per-sequence time, interpolated linearly in
        context and in k between measured points and held at the nearest end outside them
        (clamping() says where)."""
        sequences = _number(batch, 0, "batch", integer=True)
        tokens = _number(context, 1, "context", integer=False)
        proposed = _number(k, 1, "k", integer=True)
        table = np.asarray(self.per_sequence_s, dtype=float)
        at_context = [np.interp(tokens, self.contexts, table[:, j]) for j in range(len(self.ks))]
        return sequences * float(np.interp(proposed, self.ks, at_context))

    def clamping(self, context: float, k: int) -> str:
        """Where seconds() holds a point at a measured end: '' inside the measured grid."""
        said = []
        for what, value, measured in (("context", context, self.contexts), ("k", k, self.ks)):
            if value < measured[0]:
                said.append(f"{what} {value:g} priced as {measured[0]} (the least measured)")
            elif value > measured[-1]:
                said.append(f"{what} {value:g} priced as {measured[-1]} (the most measured)")
        return "; ".join(said)

    @property
    def label(self) -> str:
        grams = f"{self.min_n}-grams" if self.min_n == self.max_n else f"{self.min_n}- to {self.max_n}-grams"
        other = f" (standing in for {self.stands_in_for}: not measured there)" if self.stands_in_for else ""
        return (
            f"measured on {self.cpu} ({self.source}, {self.measured}): n-gram lookup ({grams}) x batch on the "
            f"host{other}; contexts {self.contexts[0]}-{self.contexts[-1]} tokens and k {self.ks[0]}-{self.ks[-1]} "
            "measured, interpolated linearly between them and held at the nearest end outside them"
        )

    def label_for(self, context: float, k: int) -> str:
        """The label of one point's price: label, and where the point was held at an end."""
        held = self.clamping(context, k)
        return f"{self.label}; {held}" if held else self.label

    @classmethod
    def from_csv(cls, path: str | Path) -> NgramHostCost:
        """A CSV `python -m profilers.ngram_lookup` wrote, with its metadata where present."""
        path = Path(path)
        table = _read_table(path)
        contexts, ks, seconds = _grid(table, path)
        meta = read_meta(path)
        host = str(meta.get(META_HOST) or (path.parent.parent.name if path.parent.name == FOLDER else "unknown host"))
        return cls(
            contexts,
            ks,
            tuple(tuple(float(s) for s in row) for row in seconds),
            int(table[MIN_N].iloc[0]),
            int(table[MAX_N].iloc[0]),
            str(meta.get(META_CPU) or host),
            host,
            _shown(path),
            str(meta.get(META_MEASURED) or "undated")[:10],
        )


def ngram_host_cost(roots: list[Path] | None = None, host: str | None = None) -> NgramHostCost:
    """The stored n-gram lookup cost of `host` (a CPU key; default this machine's), else the
    first stored (the user's before the shipped), its label naming the host it stands in for."""
    found = stored_ngram_lookups(roots)
    if not found:
        looked = ", ".join(str(root) for root in roots or measurement_roots())
        raise PerfkitError(
            f"no n-gram lookup measurement is stored (looked under {looked}): run `{COMMAND} --store` to measure "
            "this host's"
        )
    host = host or this_cpu_key()
    own = [path for path in found if path.parent.parent.name == host]
    cost = NgramHostCost.from_csv((own or found)[0])
    return cost if own else replace(cost, stands_in_for=host)
