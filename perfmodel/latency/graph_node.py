"""What a memory-bound kernel costs as a CUDA-graph node on a device, from its GPU checks.

A GPU check (`python -m profilers.campaign --stage gpu-check`, shipped as
<device>/gpu-check-<date>/) profiles the reference decoder's static step by kernel class
(`twin/<model>-<dtype>-static-classes.csv`): per class, the kernels a step runs, their time
measured by torch.profiler inside the step (`measured_s`) and the sum of the same calls each
replayed on the device in a CUDA graph of several copies (`predicted_s`, profilers.kernel_replay):
what those kernels cost as graph nodes, each with the gap a graph leaves between two nodes.

The node's cost is read where the memory-bound kernels (perfmodel.latency.kinds.MEMORY_KINDS:
elementwise, reduction, indexing, copy; ~1,100 of them in a Llama-2-7B step) move least: the
plain step at the smallest batch a check profiled. It is their replayed seconds over their
count: the mean a kernel costs, so that their sum is right where the bytes do not matter. Their
bytes are left in it: the decoder's trace of that step moves 22 MB through them at batch 1 and
85 MB at batch 4, under 1% of their replayed time at the datasheet bandwidth; the traced step
adds each kernel's bytes over the bandwidth on top (perfmodel.latency.traced). Why the mean and
not the smallest class: the classes' own figures differ (1.9 us for an elementwise kernel, 3.5
for an indexing one on the H100 at batch 1) and one node price serves them all. A device with
several checks takes the median of theirs.

The shipped figures (python -m profilers.closed_loop.node_classes prints them with the
per-class errors they give): h100-sxm 2.09 us (gpu-check-2026-11-28, batch 1), h200 2.62 us
(gpu-check-2026-11-28, batch 4: its batch-1 profile was cut off). The spec's `graph_node_us`
(the median tiny GEMM in aiconfigurator's CUDA-graph grids, a weight read with it: 2.95 and
2.96 us) is the price on every other device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.latency.kinds import MEMORY_KINDS
from perfmodel.measured.store import measurement_roots

CLASSES = "gpu-check-*/twin/*-static-classes.csv"
CLASS_COLUMNS = ("batch", "tree_size", "kernel_class", "kernels", "predicted_s")


@dataclass(frozen=True)
class GraphNode:
    """Seconds a memory-bound kernel costs as a graph node on one device, and what they rest on."""

    device: str  # the spec's key
    seconds: float
    kernels: int  # the replayed kernels they rest on, over every check
    batch: int  # the batch their plain steps ran at (the largest, where checks differ)
    checks: tuple[str, ...]  # the GPU checks' folders

    @property
    def label(self) -> str:
        return (
            f"{self.device} GPU check: {self.kernels} memory-bound kernels of the plain step at batch {self.batch} "
            f"replayed in CUDA graphs, {', '.join(self.checks)}"
        )


def plain_memory_rows(classes: pd.DataFrame) -> pd.DataFrame:
    """A check's memory-bound class rows of the plain step at the smallest batch it profiled."""
    missing = [c for c in CLASS_COLUMNS if c not in classes.columns]
    if missing:
        raise PerfkitError(f"not a kernel-class profile: missing columns {', '.join(missing)}")
    plain = classes[(classes["tree_size"] == 1) & classes["kernel_class"].isin(MEMORY_KINDS)]
    return plain[plain["batch"] == plain["batch"].min()] if len(plain) else plain


def node_seconds(classes: pd.DataFrame) -> float | None:
    """One check's node cost (module doc): replayed seconds over kernels; None without such rows."""
    rows = plain_memory_rows(classes)
    kernels = int(rows["kernels"].sum())
    return float(rows["predicted_s"].sum()) / kernels if kernels else None


def measured_graph_node(device_key: str, roots: list[Path] | None = None) -> GraphNode | None:
    """The node cost of a device from its GPU checks under the measurement roots (the user's,
    then the shipped), or None where it has none."""
    return _graph_node(device_key, tuple(roots or measurement_roots()))


@functools.lru_cache(maxsize=64)
def _graph_node(device_key: str, roots: tuple[Path, ...]) -> GraphNode | None:
    found = {}
    for root in roots:
        for path in sorted((root / device_key).glob(CLASSES)):
            check = path.parents[1].name
            classes = pd.read_csv(path)
            seconds = node_seconds(classes)
            if seconds is not None and check not in found:  # a check in two roots: the user's
                rows = plain_memory_rows(classes)
                found[check] = (seconds, int(rows["kernels"].sum()), int(rows["batch"].iloc[0]))
    if not found:
        return None
    seconds, kernels, batches = zip(*found.values())
    return GraphNode(device_key, float(np.median(seconds)), sum(kernels), max(batches), tuple(found))
