"""An eager step as two queues: the host issuing kernels from Python, the device running them.

Why: the reference decoder's eager GPU step is bound by its host. A llama-7b Medusa step
issues some 1,300 kernels one at a time from Python and reads values back mid-step (the
acceptance check's `int(t)` and `.tolist()`); on an H100 it was measured at 29-150 ms where
its kernels add up to about 6-18 ms. Adding up the priced kernels (price_trace) prices the
device's queue only; this module prices the host's queue too, and how the two overlap.

The model (run_pipeline), for the ops of a step in their order:

- the host issues op i in issue_s[i] seconds of its own time (Python, the dispatcher, the
  launch call), one op after the other;
- the device runs kernel i for kernel_s[i] seconds, in order; it starts once the host has
  issued it and the device has finished kernel i-1:
  start_i = max(host_i, end_(i-1)), end_i = start_i + kernel_s[i];
- a host sync (sync[i]: the host reads a device value, an `int(t)`, a `.tolist()`) stops the
  host until the device has run every kernel issued so far, op i's included:
  host_i = max(host_i, end_i). Its issue_s is the read's own cost (the call, the copy of a
  few bytes back, the wake-up), its kernel_s 0 where the read is all it does.

The step ends when both queues are done; since every kernel ends after the host issued it,
that is when the device finishes its last kernel. PipelineResult says:

- total_s: the step; host_busy_s, device_busy_s: the sums of issue_s and kernel_s;
- device_idle_s = total_s - device_busy_s: the device waiting for the host (for its next
  launch, or for the host to come back from a sync);
- host_wait_s: the host waiting at its syncs for the device;
- bound: "host" where the device idles more than half of the step (device_idle_s >
  total_s / 2: faster kernels would save less than half of it), else "device".

Vectorised: a sync leaves host and device at the same instant (the host waited for the
device, which then has nothing queued), so the ops up to and including a sync form a segment
whose length depends on its own ops only. From its start, with I_l and K_l the cumulative
issue and kernel seconds of its first l ops, its last kernel ends at
K_n + max over l of (I_l - K_(l-1)); the segments follow one another. numpy's reduceat
takes every segment's maximum at once: no Python loop over ops (5,000 ops with 40 to 1,000
syncs in 0.1-0.2 ms on a busy two-core AMD EPYC VM; the same recurrence as a Python loop
takes 1-2 ms there).

What the host pays per op (HostCosts): seconds per op issued, by kind (HOST_KINDS: the
kernels and the host-only ops of perfmodel.latency.kinds: a view or other op that launches
no kernel, an nn.Module call), and seconds per item of a pure-Python loop (`python`),
as `python -m profilers.host_dispatch` measures them on a host. That command writes a JSON
file whose keys are defined here (HOST_JSON_*, KEY_*), so the two cannot disagree on them;
HostCosts.from_json reads it.

Pricing a traced step (price_pipeline): the host issues every row of the priced trace at its
kind's host cost; the device runs each row for its device seconds (device_seconds). A
priced trace's time_s is not all device time: price_trace adds one eager launch cost to each
memory-bound kernel it prices by bytes over bandwidth, and prices a host sync as one eager
launch whole. In this model the host pays for launching, so price_pipeline takes the launch
cost price_trace charged (`launch_s`: perfmodel.latency.traced.launch_costs(latency).eager_s)
off those rows, and a host sync runs 0 seconds on the device. GEMM and attention times, and
kernels timed by replay, are the device's own and are kept; a host-only op runs 0 seconds
there (the host pays for it alone). launch_s=0 takes time_s as
device seconds already. A trace priced with cuda_graph=True is refused: a graph is one
launch for many kernels, which this eager model does not describe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.latency.kinds import HOST_ONLY_KINDS, KINDS, MEMORY_KINDS

# What the host pays for: one op of each kind a trace holds (perfmodel.latency.kinds: its
# kernels and its host-only ops) and one item of a pure-Python loop.
PYTHON = "python"
HOST_KINDS = (*KINDS, *HOST_ONLY_KINDS, PYTHON)

# The JSON file python -m profilers.host_dispatch writes and HostCosts.from_json reads:
# {KEY_FORMAT: HOST_JSON_FORMAT, KEY_VERSION: HOST_JSON_VERSION, KEY_DEVICE: "cpu"|"cuda",
#  KEY_METADATA: {...}, KEY_CLASSES: {kind: {KEY_ISSUE: s, KEY_TOTAL: s, KEY_SPREAD: x}}}
HOST_JSON_FORMAT = "medusa-perfkit host dispatch"
HOST_JSON_VERSION = 2  # 2: the host-only kinds (view, module) measured too
KEY_FORMAT = "format"
KEY_VERSION = "version"
KEY_DEVICE = "device"
KEY_METADATA = "metadata"
KEY_CLASSES = "classes"
KEY_ISSUE = "issue_s"  # host seconds to issue one op: the loop's wall time / calls (per item for python)
KEY_TOTAL = "total_s"  # the same with the final device synchronize included
KEY_SPREAD = "spread"  # (max - min) / median of the rounds' issue_s
KEY_ROUNDS = "rounds_issue_s"  # each round's issue_s
# Metadata keys the origin label reads.
META_DEVICE_NAME = "device_name"
META_TORCH = "torch"
META_MEASURED = "measured_utc"

# price_trace's sources that mark a row as timed on the device (kept whole) or priced as a
# CUDA-graph node (refused): perfmodel.latency.traced.price_trace.
MEASURED_SOURCE = "measured"
GRAPH_SOURCE = "graph node"


def _finite_non_negative(value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PerfkitError(f"{what} must be a number of seconds, got {value!r}") from None
    if not (math.isfinite(number) and number >= 0):
        raise PerfkitError(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return number


@dataclass(frozen=True)
class HostCosts:
    """Seconds the host spends issuing one op, per kind of HOST_KINDS (`python`: per item of
    a pure-Python loop); origin: where they come from (device, stack, file)."""

    seconds: Mapping[str, float] = field(hash=False)
    origin: str

    def __post_init__(self) -> None:
        missing = [kind for kind in HOST_KINDS if kind not in self.seconds]
        if missing:
            raise PerfkitError(f"host costs ({self.origin}) lack the kinds {', '.join(missing)}")
        unknown = sorted(set(self.seconds) - set(HOST_KINDS))
        if unknown:
            raise PerfkitError(
                f"host costs ({self.origin}) have unknown kinds {', '.join(unknown)}; known: {', '.join(HOST_KINDS)}"
            )
        checked = {k: _finite_non_negative(self.seconds[k], f"host cost of {k} ({self.origin})") for k in HOST_KINDS}
        object.__setattr__(self, "seconds", checked)  # a copy, checked (a plain dict: it pickles)

    def issue(self, kind: str) -> float:
        """Seconds to issue one op of `kind`."""
        if kind not in self.seconds:
            raise PerfkitError(f"no host cost for kernel kind {kind!r}; known: {', '.join(HOST_KINDS)}")
        return self.seconds[kind]

    def label(self) -> str:
        shown = ", ".join(f"{k} {self.seconds[k] * 1e6:.2f}" for k in HOST_KINDS)
        return f"host costs in us per op ({self.origin}): {shown}"

    @classmethod
    def from_dict(cls, data, origin: str) -> HostCosts:
        """The host costs of a host-dispatch document (the JSON's contents, checked)."""
        classes = check_host_json(data, origin)[KEY_CLASSES]
        return cls({kind: classes[kind][KEY_ISSUE] for kind in HOST_KINDS}, origin)

    @classmethod
    def from_json(cls, path: str | Path) -> HostCosts:
        """The host costs python -m profilers.host_dispatch measured and wrote to `path`."""
        path = Path(path)
        data = read_json(path, "host dispatch file")
        check_host_json(data, str(path))
        meta = data.get(KEY_METADATA) or {}
        where = meta.get(META_DEVICE_NAME) or data[KEY_DEVICE]
        origin = f"{where} ({data[KEY_DEVICE]}), torch {meta.get(META_TORCH, '?')}"
        origin += f", measured {meta.get(META_MEASURED, '?')}: {path.name}"
        return cls.from_dict(data, origin)


def check_host_json(data, where: str) -> dict:
    """`data` if it is a host-dispatch document with every kind's issue seconds; else a
    one-line error naming `where` (the file) and what is wrong."""
    if not isinstance(data, dict) or data.get(KEY_FORMAT) != HOST_JSON_FORMAT:
        raise PerfkitError(f"{where}: not a host dispatch file (python -m profilers.host_dispatch writes one)")
    if data.get(KEY_VERSION) != HOST_JSON_VERSION:
        raise PerfkitError(
            f"{where}: host dispatch file version {data.get(KEY_VERSION)!r}; this toolkit reads {HOST_JSON_VERSION}"
        )
    if data.get(KEY_DEVICE) not in ("cpu", "cuda"):
        raise PerfkitError(f"{where}: host dispatch file for device {data.get(KEY_DEVICE)!r}; expected cpu or cuda")
    classes = data.get(KEY_CLASSES)
    if not isinstance(classes, dict):
        raise PerfkitError(f"{where}: host dispatch file has no {KEY_CLASSES!r} table")
    missing = [k for k in HOST_KINDS if not isinstance(classes.get(k), dict) or KEY_ISSUE not in classes[k]]
    if missing:
        raise PerfkitError(f"{where}: host dispatch file lacks the {KEY_ISSUE} of {', '.join(missing)}")
    for kind in HOST_KINDS:
        _finite_non_negative(classes[kind][KEY_ISSUE], f"{where}: {kind} {KEY_ISSUE}")
    return data


@dataclass(frozen=True)
class PipelineResult:
    """One step through the two queues (module doc): seconds, and which queue bounds it."""

    total_s: float
    host_busy_s: float
    device_busy_s: float
    device_idle_s: float
    host_wait_s: float
    ops: int
    syncs: int

    @property
    def bound(self) -> str:
        """ "host" where the device idles more than half of the step, else "device"."""
        return "host" if self.device_idle_s > self.total_s / 2 else "device"

    def as_dict(self) -> dict:
        return asdict(self) | {"bound": self.bound}

    def label(self) -> str:
        idle = self.device_idle_s / self.total_s if self.total_s > 0 else 0.0
        return (
            f"{self.bound}-bound: {self.total_s * 1e3:.3f} ms step of {self.ops} ops and {self.syncs} host "
            f"sync{'' if self.syncs == 1 else 's'}; "
            f"host busy {self.host_busy_s * 1e3:.3f} ms, device busy {self.device_busy_s * 1e3:.3f} ms "
            f"(idle {idle:.0%})"
        )


def _seconds_array(values, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise PerfkitError(f"{what} must be one number of seconds per op, got an array of shape {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        bad = array[~(np.isfinite(array) & (array >= 0))][0]
        raise PerfkitError(f"{what} must be finite seconds >= 0, got {bad!r}")
    return array


def run_pipeline(issue_s: Sequence[float], kernel_s: Sequence[float], sync: Sequence[bool]) -> PipelineResult:
    """The step of these ops through the host and device queues (module doc): op i takes
    issue_s[i] host seconds to issue and kernel_s[i] device seconds to run; where sync[i],
    the host waits for the device to finish every kernel up to op i's."""
    issue = _seconds_array(issue_s, "issue_s")
    kernel = _seconds_array(kernel_s, "kernel_s")
    synced = np.asarray(sync)
    if synced.dtype != bool:
        raise PerfkitError(f"sync must be True or False per op, got values of type {synced.dtype}")
    if not (len(issue) == len(kernel) == synced.size) or synced.ndim != 1:
        raise PerfkitError(
            f"issue_s, kernel_s and sync must have one value per op, got {len(issue)}, {len(kernel)} and {synced.size}"
        )
    n = len(issue)
    if n == 0:
        return PipelineResult(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    issued, ran = np.cumsum(issue), np.cumsum(kernel)
    # A segment begins at op 0 and after every sync; it ends at a sync or the last op.
    starts = np.flatnonzero(np.concatenate(([True], synced[:-1])))
    ends = np.append(starts[1:], n) - 1
    issued_before = np.concatenate(([0.0], issued))[starts]
    ran_before = np.concatenate(([0.0], ran))[starts]
    # max over the segment's ops l of (I_l - K_(l-1)), each relative to the segment's start
    lead = np.maximum.reduceat(issued - (ran - kernel), starts) - (issued_before - ran_before)
    kernels = ran[ends] - ran_before
    lengths = kernels + lead
    waits = (lengths - (issued[ends] - issued_before))[synced[ends]]
    total = float(lengths.sum())
    device_busy = float(ran[-1])
    return PipelineResult(
        total_s=total,
        host_busy_s=float(issued[-1]),
        device_busy_s=device_busy,
        device_idle_s=max(total - device_busy, 0.0),
        host_wait_s=float(waits.sum()),
        ops=n,
        syncs=int(synced.sum()),
    )


def device_seconds(priced: pd.DataFrame, launch_s: float = 0.0) -> np.ndarray:
    """Each row's seconds on the device, from a priced trace (module doc): 0 for a host sync
    and a host-only op;
    time_s less `launch_s` (not below 0) for a memory-bound kernel priced by bytes over
    bandwidth plus a launch; time_s for the rest (GEMMs, attention, kernels timed by
    replay). launch_s: the eager launch cost price_trace charged; 0 where time_s is device
    time already. A trace priced as a CUDA graph is refused."""
    missing = [c for c in ("kind", "time_s") if c not in priced.columns]
    if missing:
        raise PerfkitError(f"not a priced trace: missing columns {', '.join(missing)} (price_trace adds time_s)")
    launch = _finite_non_negative(launch_s, "launch_s")
    codes, kinds = pd.factorize(priced["kind"], use_na_sentinel=False)
    seconds = _seconds_array(priced["time_s"].to_numpy(dtype=float), "a priced trace's time_s").copy()
    launched = np.isin(np.asarray(kinds, dtype=object), MEMORY_KINDS)[codes]
    if "source" in priced.columns:
        labelled, sources = pd.factorize(priced["source"].astype(str))  # a handful of labels: test each once
        if any(GRAPH_SOURCE in label for label in sources):
            raise PerfkitError(
                "the trace was priced as a CUDA graph (cuda_graph=True); the host pipeline prices eager launches: "
                "price it eager"
            )
        timed = np.array([label.startswith(MEASURED_SOURCE) for label in sources], dtype=bool)
        launched &= ~timed[labelled]
    seconds[launched] = np.maximum(seconds[launched] - launch, 0.0)
    seconds[np.isin(np.asarray(kinds, dtype=object), ("host_sync", *HOST_ONLY_KINDS))[codes]] = 0.0
    return seconds


def price_pipeline(
    priced: pd.DataFrame, host: HostCosts, python_items: int = 0, *, launch_s: float = 0.0
) -> PipelineResult:
    """A priced trace (perfmodel.latency.traced.price_trace) through the two queues: each
    row issued at its kind's host cost, run for its device seconds (device_seconds, with
    `launch_s` the launch cost price_trace charged each memory-bound row: pass
    launch_costs(latency).eager_s), every host_sync row a sync. python_items: items of
    pure-Python loops the step runs besides (the decoder's loops over sequences), paid by
    the host at host.issue("python") each, right after the trace's last host sync (where
    those loops read what it brought back), or at the end of a trace without one."""
    kernel = device_seconds(priced, launch_s)
    codes, kinds = pd.factorize(priced["kind"], use_na_sentinel=False)
    unknown = sorted(map(str, set(kinds) - set(HOST_KINDS) | ({PYTHON} & set(kinds))))
    if unknown:
        raise PerfkitError(f"trace has kernel kinds with no host cost: {', '.join(unknown)}")
    issue = np.array([host.seconds[kind] for kind in kinds], dtype=float)[codes]
    sync = (kinds == "host_sync")[codes]
    if not is_count(python_items, 0):
        raise PerfkitError(f"python_items must be a count >= 0, got {python_items!r}")
    if python_items:
        where = int(np.flatnonzero(sync)[-1]) + 1 if sync.any() else len(codes)
        issue = np.insert(issue, where, python_items * host.issue(PYTHON))
        kernel = np.insert(kernel, where, 0.0)
        sync = np.insert(sync, where, False)
        return replace(run_pipeline(issue, kernel, sync), ops=len(codes))
    return run_pipeline(issue, kernel, sync)
