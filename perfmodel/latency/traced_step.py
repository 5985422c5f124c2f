"""TracedStep: a model's decoding step priced from traces of its steps (one trace per batch,
context and tree size, priced kernel by kernel by perfmodel.latency.traced.price_trace), as a
step flavour speaking StepModel's interface; a launch regime priced end to end through the
host and device queues (perfmodel.latency.pipeline)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.latency.kinds import KINDS
from perfmodel.latency.pipeline import HOST_KINDS, HostCosts, price_pipeline
from perfmodel.latency.step import LatencySource, StepFlavor, StepModel
from perfmodel.latency.step_cost import PricedBySource
from perfmodel.latency.traced import (
    CAPTURED_PARTS,
    DRAFT_PARTS,
    LaunchCost,
    Tracer,
    check_cuda_graph,
    launch_costs,
    price_trace,
)
from perfmodel.models.config import ModelConfig


def check_regime(step) -> None:
    """One line where a launch regime cannot be priced on the step's device."""
    if step.regime is Launch.COMPILED:
        raise PerfkitError(
            "--launch compiled: torch.compile's fused kernels are not in the trace; price static or graph"
        )
    if step.cuda_graph:
        raise PerfkitError("--cuda-graph prices the engines' forward-only graph; with --launch, leave it out")
    if step.regime is Launch.GRAPH:
        check_cuda_graph(step.latency)
    elif getattr(step.latency.spec, "kernel_launch_us", None) is None and step.host is None:
        name = getattr(step.latency.spec, "name", "a CPU")
        raise PerfkitError(
            f"--launch {step.regime} prices a GPU's host and device queues; {name} runs its kernels on the host's own "
            "thread (its spec has no kernel_launch_us): price it without --launch"
        )


@dataclass
class TracedStep(PricedBySource):
    """Step latency of a model from traces of its steps, priced by a latency source.

    Speaks StepModel's interface (step_time, overhead), so the speedup commands take it as
    a step flavour. The tracer is handed in by the command (decoder.trace.trace_step): the
    analytic core never imports the decoder. with_heads=False: a tree step verifying a tree
    another drafter drafted (EAGLE, a draft model): the trace less its DRAFT_PARTS."""

    model: ModelConfig
    latency: LatencySource
    dtype: str
    tracer: Tracer
    flavor: str = "traced"
    cuda_graph: bool = False  # the forward part replayed from a CUDA graph (perfmodel.latency.traced)
    _cache: dict = field(default_factory=dict, repr=False)
    with_heads: bool = True
    # A launch regime (perfmodel.base.launch) priced end to end, the tracer tracing that
    # regime's step: eager and static through the host and device queues
    # (perfmodel.latency.pipeline) with `host`'s costs (default: the spec's kernel_launch_us
    # per op); graph: the static step's every kernel a graph node. None: the kernels' sum.
    regime: Launch | None = None
    host: HostCosts | None = None

    def __post_init__(self) -> None:
        if self.regime is not None:
            self.regime = Launch.parse(self.regime)
            check_regime(self)
        if self.cuda_graph:
            check_cuda_graph(self.latency)

    @property
    def launch(self) -> LaunchCost:
        return launch_costs(self.latency)

    @property
    def label(self) -> str:
        return self.latency.label

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        """A prefill is not traced: the reference decoder's prefill runs its step's inventory
        over the prompt (StepModel's reference flavour), priced by the same latency source."""
        return StepModel(self.model, self.latency, StepFlavor.REFERENCE).prefill_time(batch, prompt_len, medusa)

    @property
    def launch_label(self) -> str:
        """How this step's kernels are launched and what each launch costs."""
        if self.regime is Launch.GRAPH:
            return (
                f"graph: the static step replayed from a CUDA graph, every kernel a graph node at "
                f"{self.launch.graph_s * 1e6:.2f} us ({self.launch.node_source})"
            )
        if self.regime is not None:
            step = "the reference decoder's loop" if self.regime is Launch.EAGER else "the static step"
            return f"{self.regime}: {step}, host and device queues; {self.host_costs().label()}"
        return self.launch.label(self.cuda_graph)

    def host_costs(self) -> HostCosts:
        """The host's cost per op: `host`, else the spec's kernel_launch_us for every kernel
        kind, and nothing for the host-only ops and Python items, which a spec has no figure for
        (only a measured host, python -m profilers.host_dispatch, prices them)."""
        if self.host is not None:
            return self.host
        seconds = dict.fromkeys(HOST_KINDS, 0.0) | dict.fromkeys(KINDS, self.launch.eager_s)
        return HostCosts(seconds, f"{self.launch.origin} spec: kernel_launch_us; views, module calls: none")

    def priced(self, batch: int, seq_len: int, candidates: int = 1) -> pd.DataFrame:
        key = (int(batch), int(seq_len), int(candidates))
        if key not in self._cache:
            trace = self.tracer(self.model, *key, self.dtype)
            graph = self.cuda_graph or self.regime is Launch.GRAPH
            parts = tuple(dict.fromkeys(trace["part"])) if self.regime is Launch.GRAPH else CAPTURED_PARTS
            self._cache[key] = price_trace(trace, self.latency, self.dtype, graph, captured_parts=parts)
        return self._cache[key]

    def seconds(self, batch: int, seq_len: int, candidates: int = 1) -> float:
        """One step's seconds: its priced kernels, less the tree's drafting without heads;
        an eager or static regime's through the host and device queues."""
        priced = self.priced(batch, seq_len, candidates)
        if not self.with_heads and candidates > 1:
            priced = priced[~priced["part"].isin(DRAFT_PARTS)]
        if self.regime in (Launch.EAGER, Launch.STATIC):
            # the device keeps a graph node's cost per kernel: the gap it leaves between two
            # kernels whoever launched them; the rest of an eager launch is the host's
            launch = self.launch
            on_host = launch.eager_s - (launch.graph_s or 0.0)
            return price_pipeline(priced, self.host_costs(), launch_s=on_host).total_s
        return float(priced["time_s"].sum())

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        """Seconds per step, broadcast over the points given (one trace per distinct point)."""
        b, s, q = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (batch, seq_len, candidates)))
        out = np.array([self.seconds(*p) for p in zip(b.ravel(), s.ravel(), q.ravel())])
        return out.reshape(b.shape)

    def overhead(self, batch, seq_len, candidates) -> np.ndarray:
        return self.step_time(batch, seq_len, candidates) / self.step_time(batch, seq_len, 1)
