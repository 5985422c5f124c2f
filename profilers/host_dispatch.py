"""python -m profilers.host_dispatch: what issuing one tiny op from Python costs the host,
per kind of kernel, as the reference decoder issues its step's kernels one at a time.

Each class is one tiny op called back to back, its work next to nothing, so its time is
the host's: Python, torch's dispatcher and, on a GPU, the launch call.

- elementwise: torch.add of two 8-element tensors
- reduction: torch.sum of an 8-element tensor
- indexing: torch.index_select of 3 of 8 elements
- copy: an 8-element tensor's clone
- gemm: F.linear of an 8 x 8 input and weight (the decoder's linear layers call it)
- attention: F.scaled_dot_product_attention of a (1, 1, 1, 8) query over (1, 1, 8, 8) keys
  and values with a bool mask
- host_sync: int(t) of a one-element tensor: the device-to-host read of one value, the wait
  included (on CUDA, a read after an empty queue). The kernel that computed the value is a
  row of its own in a trace (a reduction, an argmax), priced by its own class.
- view: `m[0]`, a row of an 8 x 8 tensor: an op dispatched from Python that launches no
  kernel (the decoder's indexing, reshapes and transposes)
- module: the call of an nn.Identity module: what calling any nn.Module costs around its
  forward (its hooks and bookkeeping), the ops inside it counted apart
- python: one item of a pure-Python loop (a list append and an int add), seconds per item:
  what a loop over sequences costs beside the ops it issues.

Method: per class, N calls back to back (2,000; 500 with --quick) timed with
time.perf_counter, after a warm-up. On CUDA the loop issues its N launches without a sync
and synchronizes once after it: issue_s is the loop's wall time over N (what the host
spends), total_s the same with the final synchronize (the device's tail included); on a
CPU they are the same. Each class is the median of 5 rounds (3 with --quick); spread is
(max - min) / median of the rounds. Python's garbage collector is off while timing, and
torch runs in inference mode, as the decoder's steps do.

The JSON (keys: perfmodel.latency.pipeline, which reads it as HostCosts.from_json) goes to
--out, by default perf-reports/host-dispatch/<device>.json, with the device's name, the
CPU model, torch, Python, torch's threads and the UTC time of the measurement.
"""

from __future__ import annotations

import gc
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.base.outputs import replaced_atomically, writable_file, write_csv
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.hardware.cpu_identity import cpu_model_name
from perfmodel.latency.pipeline import (
    HOST_JSON_FORMAT,
    HOST_JSON_VERSION,
    KEY_CLASSES,
    KEY_DEVICE,
    KEY_FORMAT,
    KEY_ISSUE,
    KEY_METADATA,
    KEY_ROUNDS,
    KEY_SPREAD,
    KEY_TOTAL,
    KEY_VERSION,
    META_DEVICE_NAME,
    META_MEASURED,
    META_TORCH,
    PYTHON,
    HostCosts,
    check_host_json,
)
from profilers.device import check_device

# The classes in the order they are timed and shown: every kind the host pipeline prices
# (HOST_KINDS; tests/test_host_pipeline.py checks they are the same).
CLASSES = ("elementwise", "reduction", "indexing", "copy", "gemm", "attention", "host_sync", "view", "module", PYTHON)
CALLS, QUICK_CALLS = 2000, 500
ROUNDS, QUICK_ROUNDS = 5, 3
WARMUP = 50
PYTHON_ITEMS = 20  # items per call of the python class: loop items are some 100 times cheaper than an op
DEFAULT_OUT = "perf-reports/host-dispatch/<device>.json"


@dataclass(frozen=True)
class ClassTiming:
    """One class: host seconds per op issued and with the final sync (medians), and how far
    the rounds spread."""

    issue_s: float
    total_s: float
    spread: float
    rounds_issue_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class HostDispatch:
    """Host seconds per op of each class (CLASSES) on one device, and what was measured on."""

    device: str
    classes: Mapping[str, ClassTiming] = field(hash=False)
    metadata: Mapping[str, object] = field(hash=False)

    def __post_init__(self) -> None:
        # copies (plain dicts, so that it pickles)
        object.__setattr__(self, "classes", dict(self.classes))
        object.__setattr__(self, "metadata", dict(self.metadata))

    def as_dict(self) -> dict:
        """The JSON document (perfmodel.latency.pipeline's keys)."""
        return {
            KEY_FORMAT: HOST_JSON_FORMAT,
            KEY_VERSION: HOST_JSON_VERSION,
            KEY_DEVICE: self.device,
            KEY_METADATA: dict(self.metadata),
            KEY_CLASSES: {
                name: {
                    KEY_ISSUE: t.issue_s,
                    KEY_TOTAL: t.total_s,
                    KEY_SPREAD: t.spread,
                    KEY_ROUNDS: list(t.rounds_issue_s),
                }
                for name, t in self.classes.items()
            },
        }

    def to_json(self, path: str | Path) -> Path:
        """Written to `path` whole or not at all, its folder made first."""
        import json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with replaced_atomically(path) as temporary:
            temporary.write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, data, where: str) -> HostDispatch:
        check_host_json(data, where)
        classes = {}
        for name, row in data[KEY_CLASSES].items():
            issue = float(row[KEY_ISSUE])
            classes[name] = ClassTiming(
                issue,
                float(row.get(KEY_TOTAL, issue)),
                float(row.get(KEY_SPREAD, 0.0)),
                tuple(float(v) for v in row.get(KEY_ROUNDS, ())),
            )
        return cls(data[KEY_DEVICE], classes, data.get(KEY_METADATA) or {})

    @classmethod
    def from_json(cls, path: str | Path) -> HostDispatch:
        return cls.from_dict(read_json(path, "host dispatch file"), str(path))

    def host_costs(self, origin: str | None = None) -> HostCosts:
        """What the host pipeline prices with (perfmodel.latency.pipeline.HostCosts)."""
        where = origin or f"{self.metadata.get(META_DEVICE_NAME, self.device)} ({self.device}), measured"
        return HostCosts.from_dict(self.as_dict(), where)

    def table(self) -> pd.DataFrame:
        """One row per class: seconds per op issued and with the final sync, spread, rounds."""
        return pd.DataFrame(
            [
                {
                    "class": name,
                    "issue_s": t.issue_s,
                    "total_s": t.total_s,
                    "spread": t.spread,
                    "rounds": len(t.rounds_issue_s),
                }
                for name, t in self.classes.items()
            ]
        )


# -- measuring --------------------------------------------------------------------------------


def _python_item() -> Callable[[], object]:
    """One call: PYTHON_ITEMS items of a loop appending to a list and adding an int."""

    def items():
        out, total = [], 0
        for i in range(PYTHON_ITEMS):
            out.append(i)
            total += i
        return total

    return items


def tiny_ops(torch, device: str) -> dict[str, Callable[[], object]]:
    """Each class's op (module doc) on tiny tensors of `device`, ready to call."""
    functional = torch.nn.functional
    a, b = torch.rand(8, device=device), torch.rand(8, device=device)
    index = torch.tensor([0, 3, 5], device=device)
    m1, m2 = torch.rand(8, 8, device=device), torch.rand(8, 8, device=device)
    q = torch.rand(1, 1, 1, 8, device=device)
    k, v = torch.rand(1, 1, 8, 8, device=device), torch.rand(1, 1, 8, 8, device=device)
    mask = torch.ones(1, 1, 1, 8, dtype=torch.bool, device=device)
    value = torch.ones(1, dtype=torch.int64, device=device)
    identity = torch.nn.Identity()
    return {
        "elementwise": lambda: torch.add(a, b),
        "reduction": lambda: torch.sum(a),
        "indexing": lambda: torch.index_select(a, 0, index),
        "copy": lambda: a.clone(),
        "gemm": lambda: functional.linear(m1, m2),
        "attention": lambda: functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "host_sync": lambda: int(value),
        "view": lambda: m1[0],
        "module": lambda: identity(a),
        PYTHON: _python_item(),
    }


def time_round(call: Callable[[], object], calls: int, synchronize: Callable[[], None]) -> tuple[float, float]:
    """(issue, total) seconds per call of `calls` calls back to back: until the loop returns,
    and until the device has finished too."""
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    issued = time.perf_counter()
    synchronize()
    done = time.perf_counter()
    return (issued - start) / calls, (done - start) / calls


def time_class(
    call: Callable[[], object], calls: int, rounds: int, synchronize: Callable[[], None], per_call: int = 1
) -> ClassTiming:
    """Median and spread over `rounds` rounds; per_call: items each call does."""
    for _ in range(WARMUP):
        call()
    synchronize()
    timed = [time_round(call, calls, synchronize) for _ in range(rounds)]
    issue = [i / per_call for i, _ in timed]
    total = [t / per_call for _, t in timed]
    middle = statistics.median(issue)
    spread = (max(issue) - min(issue)) / middle if middle > 0 else 0.0
    return ClassTiming(middle, statistics.median(total), spread, tuple(issue))


def metadata(torch, device: str, calls: int, rounds: int) -> dict:
    cpu = cpu_model_name()
    name = torch.cuda.get_device_name() if device == "cuda" else cpu
    return {
        META_DEVICE_NAME: name,
        "cpu_model": cpu,
        META_TORCH: torch.__version__,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "calls": calls,
        "rounds": rounds,
        META_MEASURED: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def measure_host_dispatch(device: str, quick: bool = False) -> HostDispatch:
    """Host seconds per tiny op of each class on `device` ("cpu" or "cuda"), measured now
    (module doc); quick: fewer calls and rounds."""
    check_device(device)
    import torch

    calls, rounds = (QUICK_CALLS, QUICK_ROUNDS) if quick else (CALLS, ROUNDS)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ops = tiny_ops(torch, device)
    collecting = gc.isenabled()
    gc.disable()
    try:
        classes = {}
        with torch.inference_mode():  # as the decoder runs its steps: no autograd bookkeeping per op
            for name in CLASSES:
                per_call = PYTHON_ITEMS if name == PYTHON else 1
                classes[name] = time_class(ops[name], calls, rounds, synchronize, per_call)
    finally:
        if collecting:
            gc.enable()
    for name, timing in classes.items():
        if not (math.isfinite(timing.issue_s) and timing.issue_s > 0):
            raise PerfkitError(f"{name}: timed {timing.issue_s!r} s per op; the clock cannot resolve it")
    return HostDispatch(device, classes, metadata(torch, device, calls, rounds))


# -- the command ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostDispatchOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    device: str | None = field(default=None, metadata=shared(options.visible_device))
    quick: bool = field(
        default=False,
        metadata=option(
            "--quick",
            f"{QUICK_CALLS} calls x {QUICK_ROUNDS} rounds per class instead of {CALLS} x {ROUNDS} (a second or so)",
            action="store_true",
        ),
    )
    out: Path | None = field(
        default=None,
        metadata=shared(options.out, default=DEFAULT_OUT, what="the JSON of host seconds per op", metavar="FILE.json"),
    )
    csv: Path | None = field(default=None, metadata=shared(options.csv, what="the table of host seconds per op"))


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.host_dispatch", description=__doc__.split("\n\n")[0])
    add_options(p, HostDispatchOptions)
    return p


def render(result: HostDispatch) -> str:
    """The aligned table the command prints: microseconds per op (per item for python)."""
    meta = result.metadata
    lines = [
        f"host dispatch on {meta.get(META_DEVICE_NAME)} ({result.device}), torch {meta.get(META_TORCH)}, "
        f"Python {meta.get('python')}, {meta.get('threads')} threads: measured, median of {meta.get('rounds')} "
        f"rounds of {meta.get('calls')} calls"
    ]
    lines.append(f"  {'class':<12} {'issue us/op':>12} {'total us/op':>12} {'spread':>8}")
    for name, t in result.classes.items():
        unit = "  (per loop item)" if name == PYTHON else ""
        lines.append(f"  {name:<12} {t.issue_s * 1e6:>12.3f} {t.total_s * 1e6:>12.3f} {t.spread:>8.1%}{unit}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = read_options(HostDispatchOptions, build_parser().parse_args(argv))
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device)  # one line where --device cuda finds no CUDA device
    out = args.out or Path(DEFAULT_OUT.replace("<device>", device))
    writable_file(out, "--out file")
    if args.csv:
        writable_file(args.csv, "--csv file")
    result = measure_host_dispatch(device, quick=args.quick)
    result.to_json(out)
    print(render(result))
    if args.csv:
        write_csv(result.table(), args.csv)
        print(f"table: {args.csv}")
    print(f"json: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
