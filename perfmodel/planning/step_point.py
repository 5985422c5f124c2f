"""One point's answer: a given tree size and acceleration at one batch and context.

Practitioners who measured their heads' acceptance (tokens per step, the acceleration) ask
what a step of their tree costs against a plain step and what speedup that buys:
overhead = Medusa step / plain step, speedup = acceleration / overhead (the paper's
definitions). One row per step flavour (paper, full, traced)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from perfmodel.acceptance.trees import most_tokens_per_step
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.latency.kinds import kernel_rows
from perfmodel.latency.step import FULL_STEP_LEAVES_OUT, StepFlavor, step_inventory
from perfmodel.latency.traced import kind_shares
from perfmodel.latency.traced_step import TracedStep

POINT_COLUMNS = (
    "device",
    "model",
    "dtype",
    "step",
    "batch",
    "context",
    "tree_size",
    "acceleration",
    "plain_step_ms",
    "medusa_step_ms",
    "overhead",
    "speedup",
    "plain_kernels",
    "medusa_kernels",
    "latency_model",
    "launch",
    "kernel_launch_us",
    "graph_node_us",
    "source",
)


def kernels_launched(step, batch: int, context: int, candidates: int) -> int:
    """Kernels one step launches: the trace's rows, or the inventory's op counts (one kernel
    per op call, the paper and full steps' own accounting)."""
    inner = step.shard
    if isinstance(inner, TracedStep):
        return len(kernel_rows(inner.priced(batch, context, candidates)))
    return sum(item.count for item in step_inventory(inner.model, inner.flavor, candidates > 1))


def launch_columns(step) -> dict:
    """How a traced step launches its kernels (eager, cuda graph) and the per-kernel costs it
    charged, in microseconds (graph_node_us only in graph mode); empty for the paper and full
    steps, whose per-kernel overhead is the latency source's (its label says so)."""
    inner = step.shard
    if not isinstance(inner, TracedStep):
        return {"launch": "", "kernel_launch_us": np.nan, "graph_node_us": np.nan}
    launch = inner.launch
    if inner.regime is not None:
        return {
            "launch": str(inner.regime),
            "kernel_launch_us": np.nan if inner.regime is Launch.GRAPH else inner.host_costs().issue("gemm") * 1e6,
            "graph_node_us": launch.graph_s * 1e6 if inner.regime is Launch.GRAPH else np.nan,
        }
    return {
        "launch": "cuda graph" if inner.cuda_graph else "eager",
        "kernel_launch_us": launch.eager_s * 1e6,
        "graph_node_us": launch.graph_s * 1e6 if inner.cuda_graph else np.nan,
    }


def step_point(steps: dict, batch: int, context: int, tree_size: int, acceleration: float) -> pd.DataFrame:
    """Rows (without the device columns) for each flavour's step model in `steps`."""
    if tree_size < 2:
        raise PerfkitError(f"--tree-size {tree_size}: a Medusa tree has the root and at least one candidate (>= 2)")
    heads = next(iter(steps.values())).model.medusa_heads
    most = most_tokens_per_step(tree_size, heads)
    if not (math.isfinite(acceleration) and 1 <= acceleration <= most):
        raise PerfkitError(
            f"--acceleration {acceleration:g}: a {tree_size}-token tree of a model with {heads} Medusa heads yields 1 "
            f"to {most} tokens a step (its longest path of {most - 1} candidate(s), each accepted, and the model's own "
            "token)"
        )
    rows = []
    for flavor, step in steps.items():
        plain = float(np.asarray(step.step_time(batch, context, 1)).ravel()[0])
        medusa = float(np.asarray(step.step_time(batch, context, tree_size)).ravel()[0])
        overhead = medusa / plain
        rows.append(
            {
                "step": flavor,
                "batch": batch,
                "context": context,
                "tree_size": tree_size,
                "acceleration": acceleration,
                "plain_step_ms": plain * 1e3,
                "medusa_step_ms": medusa * 1e3,
                "overhead": overhead,
                "speedup": acceleration / overhead,
                "plain_kernels": kernels_launched(step, batch, context, 1),
                "medusa_kernels": kernels_launched(step, batch, context, tree_size),
                "latency_model": step.label,
                **launch_columns(step),
                "source": "predicted",
            }
        )
    return pd.DataFrame(rows)


def point_lines(steps: dict, rows: pd.DataFrame) -> list[str]:
    """What a person reads: per flavour the two steps, overhead and speedup; for a traced
    step, how its kernels are launched (eager or a CUDA graph, and the cost of each) and the
    share of each step's time each kernel class takes; first, where a full step is priced, what
    it leaves out."""
    lines = [FULL_STEP_LEAVES_OUT] if (rows["step"] == StepFlavor.FULL).any() else []
    for r in rows.itertuples():
        lines.append(
            f"  {r.step}: plain step {r.plain_step_ms:.3f} ms ({r.plain_kernels} kernels), Medusa step "
            f"{r.medusa_step_ms:.3f} ms ({r.medusa_kernels} kernels): overhead {r.overhead:.3f}, speedup "
            f"{r.speedup:.2f}x at acceleration {r.acceleration:g}"
        )
        inner = steps[r.step].shard
        if isinstance(inner, TracedStep):
            lines.append(f"    launch: {inner.launch_label}")
            for name, candidates in (("plain", 1), ("Medusa", r.tree_size)):
                shares = kind_shares(inner.priced(r.batch, r.context, candidates))
                parts = ", ".join(f"{s.kind} {s.share:.0%} ({s.kernels})" for s in shares.itertuples())
                lines.append(f"    {name} step time by kernel class (kernels): {parts}")
    return lines
