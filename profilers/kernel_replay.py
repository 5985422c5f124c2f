"""A traced step's own kernels timed on a device: every distinct operator call of a trace
(decoder.trace records each as replayable JSON, decoder.trace_ops.encode_call) run again on real
tensors of its exact shapes, strides and dtypes, and timed one by one.

This is the measured side of pricing a trace (perfmodel.latency.traced.price_trace takes
the times as `measured`): where a shape-level model prices a verification's argmax by its
bytes, or an attention call as a contiguous SDPA with an all-true mask, the replay runs the
very call the step makes (the argmax over bf16 logits, the attention over a strided slice of
the cache with the tree's mask), so its compute-bound and layout-bound costs count.

Values do not change what these kernels cost, so they are made up: floating tensors random
normal, integer tensors zeros (position 0, a valid index into anything), bool tensors True.
A model weight or the KV cache (marked "w" in the call) is read cold, as a step streams its
weights once and reads each layer's cache once: each run takes the next of as many copies
of it as fit in a pool of twice the last-level cache. Activations stay warm: the kernel
before them in the step just wrote them.

On a CPU the calls are sampled a round at a time, a round running every traced step kernel
by kernel in its order, so that rounds can be spread over decoding runs
(profilers.closed_loop.twin takes one between batches, as profilers.timer.InterleavedSampler
spreads its rounds) and the kernels see the machine the decoding saw, as loaded as a step
loads it. On a GPU each call is timed in a CUDA graph of several calls (CUDA events where it
cannot be captured). A call that cannot run again (an argument no JSON holds, an error
on made-up values) is listed in `failed` and left to the analytic price.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from perfmodel.base.errors import PerfkitError
from profilers.timer import TimerConfig, time_cuda_events, time_cuda_graph

GRAPH_COPIES = 8  # calls per CUDA graph that times a call
REPLAY_TIMER = TimerConfig(warmup=1, min_reps=5, max_reps=400, target_noise=0.02, budget_s=0.2, flush_cache=False)
# On a GPU each call is timed on its own: a few hundred calls a setting, so a short budget.
GPU_REPLAY_TIMER = TimerConfig(warmup=2, min_reps=10, max_reps=100, target_noise=0.02, budget_s=0.05, flush_cache=False)


class Unreplayable(Exception):
    """A call holds an argument its JSON cannot bring back."""


class WeightPool:
    """Cold copies of weights: views into one buffer per dtype of `pool_bytes`, a weight
    of E elements getting pool // E copies (at least one), taken in turn."""

    def __init__(self, device: torch.device, pool_bytes: int):
        self.device, self.pool_bytes = device, pool_bytes
        self._buffers: dict[torch.dtype, torch.Tensor] = {}

    def copies(self, shape: list[int], stride: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
        extent = storage_extent(shape, stride)
        elements = max(self.pool_bytes // torch.empty((), dtype=dtype).element_size(), extent)
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.numel() < elements:
            buffer = torch.empty(elements, dtype=dtype, device=self.device)
            fill(buffer)
            self._buffers[dtype] = buffer
        count = max(1, buffer.numel() // max(extent, 1))
        return [buffer.as_strided(shape, stride, i * extent) for i in range(count)]


def storage_extent(shape: list[int], stride: list[int]) -> int:
    """Elements of storage a tensor of this shape and stride spans."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def fill(t: torch.Tensor) -> torch.Tensor:
    """Made-up values (the module doc): random normal, zeros, True."""
    if t.is_floating_point() or t.is_complex():
        return t.normal_()
    return t.fill_(True) if t.dtype == torch.bool else t.zero_()


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise Unreplayable(f"unknown dtype {name!r}")
    return dtype


def operator(name: str):
    """torch.ops.aten.mm.default from "aten.mm.default"."""
    namespace, packet, overload = name.split(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except AttributeError as error:
        raise Unreplayable(f"no operator {name}") from error


@dataclass
class ReplayedCall:
    """One distinct call made runnable: `run()` executes it once on the next weight copies."""

    call: str
    func: object
    variants: list[tuple[list, dict]]  # (args, kwargs), one per weight copy (one when it reads none)
    turn: int = 0

    def run(self) -> object:
        args, kwargs = self.variants[self.turn % len(self.variants)]
        self.turn += 1
        return self.func(*args, **kwargs)


def materialize(call: str, device: torch.device, pool: WeightPool) -> ReplayedCall:
    """The call of a trace row (decoder.trace_ops.encode_call) on real tensors on `device`."""
    name, args, kwargs = json.loads(call)
    weights: list[list[torch.Tensor]] = []

    def build(value):
        if isinstance(value, list):
            return [build(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "t" in value:
            dtype = dtype_of(value["d"])
            if value.get("w"):
                weights.append(pool.copies(value["t"], value["s"], dtype))
                return ("weight", len(weights) - 1)
            where = torch.device("cpu") if value.get("h") else device
            base = torch.empty(storage_extent(value["t"], value["s"]), dtype=dtype, device=where)
            return fill(base).as_strided(value["t"], value["s"])
        if "dtype" in value:
            return dtype_of(value["dtype"])
        if "device" in value:
            return torch.device("cpu") if value["device"] == "host" else device
        if "enum" in value:
            return getattr(torch, value["enum"])
        raise Unreplayable(f"argument {value.get('unknown', value)!r}")

    built_args, built_kwargs = build(args), {k: build(v) for k, v in kwargs.items()}
    count = max((len(w) for w in weights), default=1)

    def variant(i: int):
        def pick(value):
            if isinstance(value, tuple) and len(value) == 2 and value[0] == "weight":
                copies = weights[value[1]]
                return copies[i % len(copies)]
            if isinstance(value, list):
                return [pick(v) for v in value]
            return value

        return pick(built_args), {k: pick(v) for k, v in built_kwargs.items()}

    return ReplayedCall(call, operator(name), [variant(i) for i in range(count)])


@dataclass
class KernelTimes:
    """Median seconds of every distinct call of some traces on `device`, measured by replay
    (the module doc). Build, take rounds (CPU) between other work, then read `times()`."""

    device: torch.device
    cache_bytes: int
    timer: TimerConfig = REPLAY_TIMER
    calls: list[ReplayedCall] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # call -> why it was not replayed
    samples: list[list[float]] = field(default_factory=list, repr=False)
    order: list[int] = field(default_factory=list, repr=False)  # calls in the traces' order, row by row
    rounds: int = 0

    @classmethod
    def of(cls, traces, device: str | torch.device, cache_bytes: int, timer: TimerConfig | None = None):
        """Every distinct call of the traces (tables with a `call` column) made runnable and
        run once (a call that fails on made-up values is caught here, not mid-sampling)."""
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise PerfkitError("kernel replay on cuda: no CUDA device is visible here")
        out = cls(device, cache_bytes, timer or (GPU_REPLAY_TIMER if device.type == "cuda" else REPLAY_TIMER))
        pool = WeightPool(device, 2 * cache_bytes)
        distinct = dict.fromkeys(c for trace in traces for c in trace["call"] if isinstance(c, str) and c)
        with torch.inference_mode():
            for call in distinct:
                try:
                    replayed = materialize(call, device, pool)
                    replayed.run()
                except Unreplayable as error:
                    out.failed[call] = str(error)
                    continue
                except (RuntimeError, ValueError, TypeError, IndexError) as error:
                    out.failed[call] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                    continue
                out.calls.append(replayed)
        out.samples = [[] for _ in out.calls]
        index = {c.call: i for i, c in enumerate(out.calls)}
        out.order = [index[c] for trace in traces for c in trace["call"] if c in index]
        return out

    def round(self) -> None:
        """The traced steps run once more kernel by kernel, in their order (CPU), each
        kernel's call sampled: the machine works as hard as in the step (a 64-token tree's
        GEMMs back to back run some 7% slower than each alone on a 2-core Xeon). Each call
        is run once untimed first, on other weight copies: its activations and output
        buffer are then warm, as the kernel before it in a step leaves them, while the
        weights it is timed on are not (the module doc)."""
        with torch.inference_mode():
            for i in self.order:
                call = self.calls[i]
                call.run()
                started = time.perf_counter()
                call.run()
                self.samples[i].append(time.perf_counter() - started)
        self.rounds += 1

    def _cuda_seconds(self, call) -> float:
        """Per call, GRAPH_COPIES calls (each on its next weight copy) replayed from a CUDA
        graph: a lone launch's own overhead, which CUDA events around one short kernel
        count as the kernel's, is not in it. A call that cannot be captured (it reads a
        value back) is timed with CUDA events instead."""
        try:
            return time_cuda_graph([call.run] * GRAPH_COPIES, self.timer).median_s
        except RuntimeError:
            torch.cuda.synchronize()
            return time_cuda_events(call.run, self.timer).median_s

    def times(self) -> dict[str, float]:
        """call -> median seconds: the CPU's rounds topped up to the timer's min_reps, or on
        a GPU each call timed now with CUDA events."""
        if self.device.type == "cuda":
            with torch.inference_mode():
                return {c.call: self._cuda_seconds(c) for c in self.calls}
        while self.rounds < self.timer.min_reps:
            self.round()
        return {c.call: float(np.median(s)) for c, s in zip(self.calls, self.samples)}
