"""The measurement campaign's plan, as data: its stages (which ones each variant runs:
profilers.campaign_variants), what each measures, how many points and into which file under
`<out>/<device key>/`.

- `CeilingsStage`: the device's identity (on a GPU NVML's name, UUID, driver, clocks and
  power limit; torch and CUDA versions) and its ceilings (profilers.ceilings) ->
  `ceilings.json`. The sweeps after it record these ceilings in their run metadata, where
  the roofline looks for a device's measured ceilings.
- `SweepStage`: one profilers.sweep sweep of one model, into the sweep's own file with its
  journal and `.meta.json`: the linear ops on the fine token grid, or attention (qk, pv and
  sdpa with the causal or tree mask) over the paper grid.
- `GemmStage`: single GEMMs (m x k) @ (k x n), the weight shapes of the toolkit's model
  presets at tensor-parallel degrees 1, 2, 4 and 8 over a token grid: what
  perfmodel.latency keys linear ops on, for every preset and shard, not only the paper's
  models -> `gemm/gemm-<dtype>.csv`. Data-contract rows with op `gemm`, phase prefill,
  batch 1, seq_len = m (the token rows), `model` naming the shape (gemm-k<k>-n<n>) and the
  columns `n` and `k`: the row form of a device-wide GEMM grid
  (perfmodel.measured.aiconfigurator.contract_rows), in a folder of its own so the
  per-model readers of `<device>/*.csv` do not take its shapes for models.
- `TwinStage`: the performance twin's closed loop (profilers.closed_loop.twin): a model's
  config.json with dummy weights decoding plain and with Medusa trees whose acceptance
  replays a real run's record, batch by batch, each step beside its prediction from the
  traced step priced by the step's own kernels replayed on the device -> `twin/<model>-
  <dtype>.csv`, its per-kernel-class table beside it and `.meta.json` with each batch's
  calibration; a batch already in the file is not run again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.latency.pipeline import HOST_KINDS
from perfmodel.models.config import PRESETS, ModelConfig
from perfmodel.models.grid import Grid, iter_points
from profilers.timer import TimerConfig

MANIFEST = "campaign.json"
CEILINGS_FILE = "ceilings.json"
HOST_DISPATCH_FILE = "host-dispatch.json"
# Tensor-parallel degrees whose shards' GEMM shapes the grid holds: the planner's range (1-8 on one node).
TP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class CeilingsStage:
    name: str
    dtypes: tuple[str, ...] | None  # None: every dtype the device runs (profilers.ceilings.supported_dtypes)
    timer: TimerConfig
    streams: bool = True  # the bandwidth streams (False: peaks and kernel overhead only)
    out: str = CEILINGS_FILE

    @property
    def what(self) -> str:
        dtypes = " ".join(self.dtypes) if self.dtypes else "every dtype the device runs"
        streams = "bandwidth (copy, triad, read), " if self.streams else "no bandwidth, "
        return f"identity (NVML on a GPU), {streams}matmul peak ({dtypes}), kernel overhead"

    def size(self) -> int:
        """Measurements: three bandwidth streams, a peak per dtype (up to 5 on a GPU), the kernel overhead."""
        return 3 * self.streams + (len(self.dtypes) if self.dtypes else 5) + 1


@dataclass(frozen=True)
class SweepStage:
    name: str
    model: ModelConfig
    grid: Grid
    ops: tuple[str, ...]
    phases: tuple[str, ...]
    out: str

    @property
    def what(self) -> str:
        tokens = self.grid.linear_tokens
        where = (
            f"prefill, batch 1, {len(set(tokens) | set(self.grid.seq_lens))} token counts "
            f"{min(tokens)}..{max(max(tokens), max(self.grid.seq_lens))}"
            if tokens
            else f"{'/'.join(self.phases)}, batch {_span(self.grid.batches)}, seq {_span(self.grid.seq_lens)}, "
            f"candidates {_span(self.grid.candidates)}"
        )
        return f"{self.model.name} {' '.join(self.ops)}: {where}"

    @cached_property
    def points(self) -> list[tuple[str, str, int, int, int]]:
        return list(iter_points(self.model, self.grid, self.ops, self.phases))

    def size(self) -> int:
        return len(self.points)


@dataclass(frozen=True)
class GemmStage:
    name: str
    shapes: tuple[tuple[int, int], ...]  # (k, n) of each weight, sorted
    tokens: tuple[int, ...]
    out: str
    models: tuple[str, ...] = ()  # whose shapes
    degrees: tuple[int, ...] = TP_DEGREES
    sources: dict = field(default_factory=dict, compare=False)  # (k, n) -> the preset ops with that shape

    @property
    def what(self) -> str:
        whose = "every model preset" if set(self.models) == set(PRESETS) else " ".join(self.models)
        return (
            f"{len(self.shapes)} weight shapes (k x n) of {whose} at TP {'/'.join(map(str, self.degrees))}, "
            f"{len(self.tokens)} token counts {min(self.tokens)}..{max(self.tokens)}"
        )

    @property
    def points(self) -> list[tuple[int, int, int]]:
        """(k, n, m) in measuring order: shape by shape, so a shape's weight is made once."""
        return [(k, n, m) for k, n in self.shapes for m in self.tokens]

    def size(self) -> int:
        return len(self.shapes) * len(self.tokens)


@dataclass(frozen=True)
class TwinStage:
    name: str
    model: str  # a config.json folder (or `bundled`)
    record: str  # a decoder.measure record with path_lengths: the acceptance every tree replays
    batches: tuple[int, ...]
    sizes: tuple[int, ...]  # tree sizes, the plain step besides
    prompts: int
    prompt_len: int
    new_tokens: int
    out: str
    launch: Launch = Launch.EAGER  # how its steps run
    profile: bool = True  # each kernel class's share under torch.profiler (slow on a GPU)
    rounds: int = 1  # interleaved timing passes over the prompts

    @property
    def what(self) -> str:
        return (
            f"performance twin of {Path(self.model).name} (dummy weights, {Path(self.record).name}'s acceptance "
            f"replayed), {self.launch} steps: batch {'/'.join(map(str, self.batches))}, plain and trees of "
            f"{'/'.join(map(str, self.sizes))} tokens, {self.prompts} prompts x {self.new_tokens} tokens"
            + (f", {self.rounds} rounds" if self.rounds > 1 else "")
            + ", measured beside the predicted step"
        )

    def size(self) -> int:
        """Settings measured: the plain step and every tree, at every batch size."""
        return len(self.batches) * (len(self.sizes) + 1)


@dataclass(frozen=True)
class HostDispatchStage:
    """The host's cost of issuing one tiny op of each kernel kind (profilers.host_dispatch):
    what the twin's eager steps are priced with, on a GPU."""

    name: str
    quick: bool
    out: str = HOST_DISPATCH_FILE

    @property
    def what(self) -> str:
        return "host seconds to issue one tiny op, per kernel kind, back to back from Python"

    def size(self) -> int:
        return len(HOST_KINDS)


Stage = CeilingsStage | SweepStage | GemmStage | TwinStage | HostDispatchStage


@dataclass(frozen=True)
class Plan:
    device: str  # cpu | cuda
    variant: str  # full | quick
    dtype: str
    timer: TimerConfig  # of the sweeps and the GEMM grid
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise PerfkitError(f"no stage {name!r} in the {self.variant} plan; stages: {', '.join(self.names())}")

    def names(self) -> list[str]:
        return [s.name for s in self.stages]


def _span(values: tuple[int, ...]) -> str:
    return str(values[0]) if len(values) == 1 else f"{min(values)}..{max(values)}"
