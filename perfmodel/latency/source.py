"""One latency source for any model on any device: measured where the device was measured,
calibrated on those measurements elsewhere, borrowed from a measured device of the same
architecture, or the datasheet roofline. Whose measurements (the software stack) is a choice:
`stack` (perfmodel.latency.gemm_grid: vidur, vllm, sglang, trtllm).

GPU latency is a staircase in the token count (tile and kernel choice), not the smooth
roofline: a 4096 x 22016 fp16 GEMM on an A100 takes ~116 us for 1-64 tokens, 150-157 us
for 88-128 and 205 us at 136. So linear ops (one GEMM against a weight) are keyed on the
GEMM's weight shape (k, n) and its token count m = batch x query length:

- **measured**: the weight shape was measured on this device: the time is interpolated
  linearly in tokens on the measured token grid (every 8 tokens in the shipped profiles),
  which keeps the steps;
- **calibrated**: a shape not measured on this device: the roofline with its three
  parameters fitted to the device's measured linear ops (perfmodel.latency.fit), times
  the staircase of the nearest measured shapes (their measured / fitted ratio at the same
  token count, weighted by closeness in log k and log n). The steps come from the data;
  nothing about tiles is hard-coded;
- **borrowed**: a device without measurements takes the calibration (fitted efficiencies
  and staircase) of a measured device of the same `architecture` (hw_specs), on its own
  datasheet roofline;
- **grid**: an engine stack's device-wide GEMM grid (aiconfigurator's tables), interpolated
  in n and k with the staircase in m kept (perfmodel.latency.gemm_grid);
- **transferred**: a device without measurements whose architecture nobody measured takes
  an engine's GEMM times from every measured device, scaled by physics (sustained tensor
  clock, memory class and its bandwidth share, SM waves: perfmodel.latency.transfer); its
  label carries the method's leave-one-device-out error;
- **datasheet**: the roofline with the public efficiency defaults (perfmodel.latency.roofline).

Attention (qk, pv, the fused sdpa) is measured where the device has an engine's attention
tables (perfmodel.latency.attention_table: decode, prefill, and the tree step mapped onto the
decode kernel), the roofline elsewhere; the label says which.

With the `vidur` stack on a device that also has a grid, a shape Vidur did not measure is the
geometric mean of the calibrated prediction and the grid's shape dependence at Vidur's level
(GemmTable.grid_predict): the two err in different places, and their mean beats each on the
leave-one-model-out check (python -m perfmodel.latency_check).

An MoE model's fused experts and a latent-attention model's attention module come from the
engines' measured MoE layers and MLA modules (perfmodel.latency.module_tables), except on the
datasheet. Ops the measurements do not cover
(attention, the Medusa tree's own work) use the roofline with the calibrated efficiencies where
there is a calibration, else the defaults. Measured elementwise ops (norm, act, ...) are used
where the profile is of the same model shard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.precision import check_runs_on
from perfmodel.base.stacks import SERVING_ENGINES, Engine, engine_of
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec, load_all_specs
from perfmodel.latency.attention_grid import HEAD_DIM
from perfmodel.latency.attention_table import attention_table
from perfmodel.latency.choice import LatencyChoice, LatencyMode, LatencySetting
from perfmodel.latency.gemm_grid import (
    AUTO_STACK,
    ENGINES,
    TORCH,
    VIDUR,
    GemmGrid,
    default_grid,
    gemm_grid,
    resolve_stack,
    stack_names,
    torch_stack,
)
from perfmodel.latency.gemm_table import (
    GemmTable,
    fit_params,
    profile_rows,
    same_shard,
    stack_calibration,
    stored_calibration,
)
from perfmodel.latency.latency_model import LatencyModel
from perfmodel.latency.module_tables import with_modules
from perfmodel.latency.quantized import QuantizedGemms
from perfmodel.latency.transfer import transferred_gemm
from perfmodel.measured.device_view import DeviceView
from perfmodel.measured.evidence import DeviceEvidence, as_evidence, device_evidence
from perfmodel.measured.store import stored_profiles
from perfmodel.models.config import ModelConfig, load_model


@dataclass(frozen=True)
class SourceRequest:
    """One latency source to build: `model` in `dtype` on the device of `evidence`, as the
    choice `setting` and `stack` asks (the stack as asked: None, auto, an engine or an
    engine-version); `measurements`: rows given instead of the stored ones (None: none);
    `params`: the datasheet roofline's efficiencies."""

    evidence: DeviceEvidence
    model: ModelConfig
    dtype: str
    setting: LatencySetting
    stack: str | None
    measurements: pd.DataFrame | None
    params: RooflineParams

    @property
    def spec(self) -> HardwareSpec:
        return self.evidence.spec

    @property
    def measured_mode(self) -> LatencyMode:
        """What a source resting on the device's own rows is: calibrated where forced, else measured."""
        return LatencyMode.CALIBRATED if self.setting == LatencySetting.CALIBRATED else LatencyMode.MEASURED

    @property
    def given(self) -> bool:
        """Whether rows of this dtype were given."""
        rows = self.measurements
        return rows is not None and bool(len(rows)) and bool((rows["dtype"] == self.dtype).any())

    def datasheet(self) -> LatencyModel:
        return LatencyModel(self.spec, self.model, self.dtype, LatencyMode.DATASHEET, params=self.params)

    def on_rows(self, table: GemmTable, stack: str, **beside) -> LatencyModel:
        """A source resting on the device's own GEMM rows (`table`, its fitted roofline for the
        rest); `beside`: elementwise rows, a grid, attention tables where there are some."""
        return LatencyModel(
            self.spec, self.model, self.dtype, self.measured_mode, table, params=table.params, stack=stack, **beside
        )


def from_given(request: SourceRequest) -> LatencyModel:
    """Rows given (a sweep of this machine, --measurements), with the device's profiles beside them."""
    rows, origin = profile_rows(request.evidence)
    # where given rows and a profile time the same shape and token count, the median of both counts
    rows = request.measurements if rows is None else pd.concat([request.measurements, rows], ignore_index=True)
    rows = rows[rows["dtype"] == request.dtype]
    origin = "given measurements" + (f" + {origin}" if origin else "")
    table = GemmTable.of(rows, request.spec, request.dtype, origin)
    return request.on_rows(table, "given", elementwise=same_shard(table.rows, request.model))


def from_profiles(request: SourceRequest, stack: str) -> LatencyModel | None:
    """Vidur's per-model profiles, calibrated; an engine's grid beside them for shapes they lack."""
    evidence, dtype = request.evidence, request.dtype
    table = stored_calibration(evidence, dtype)
    if table is None:
        return None
    return request.on_rows(
        table,
        stack,
        elementwise=same_shard(table.rows, request.model),
        grid=default_grid(evidence, dtype),
        attention=attention_table(evidence, None, dtype, head_dim=request.model.head_dim),
    )


def from_campaign(request: SourceRequest, stack: str) -> LatencyModel | None:
    """This project's own GPU campaign (a torch stack): its GEMMs calibrated, its attention."""
    table = stack_calibration(request.evidence, stack, request.dtype)
    if table is None:
        return None
    attention = attention_table(request.evidence, stack, request.dtype, head_dim=request.model.head_dim)
    return request.on_rows(table, stack, attention=attention)


def from_grid(request: SourceRequest, stack: str) -> LatencyModel | None:
    """An engine's device-wide GEMM grid and its attention tables."""
    grid = gemm_grid(request.evidence, stack, request.dtype)
    if grid is None:
        return None
    attention = attention_table(request.evidence, stack, request.dtype, head_dim=request.model.head_dim)
    params = grid_params(grid, request.spec)
    return LatencyModel(
        request.spec,
        request.model,
        request.dtype,
        LatencyMode.GRID,
        params=params,
        stack=stack,
        grid=grid,
        attention=attention,
    )


# What each measured stack's engine builds (None: nothing in this dtype): a new harness is one entry.
MEASURED_SOURCES: dict[Engine, Callable[[SourceRequest, str], LatencyModel | None]] = {
    Engine.VIDUR: from_profiles,
    Engine.TORCH: from_campaign,
    **dict.fromkeys(SERVING_ENGINES, from_grid),
}


def latency_source(
    device: str | HardwareSpec | DeviceEvidence,
    model: str | ModelConfig,
    dtype: str | None = None,
    source: str | LatencyChoice = "auto",
    measurements: pd.DataFrame | None = None,
    params: RooflineParams | None = None,
    stack: str | None = None,
) -> LatencyModel:
    """The latency source for `model` on `device` (its evidence, a name, alias or HardwareSpec).
    source: auto (measured > calibrated > borrowed > datasheet, as the data allow), or one
    of measured / calibrated / datasheet to force it; forcing what the data cannot give is
    an error. measurements: data-contract rows to use instead of the stored profiles.
    params: the datasheet roofline's efficiencies (default: the public defaults). dtype: None
    for the device's default (perfmodel.base.dtypes.default_dtype). stack: whose measurements
    (vidur, vllm, sglang, trtllm, or an engine-version such as vllm-0.24.0); None: the
    device's per-model profiles (vidur) where it has them, else its first engine grid.
    """
    choice = LatencyChoice.of(source, stack)
    evidence = as_evidence(device)
    request = SourceRequest(
        evidence,
        model if isinstance(model, ModelConfig) else load_model(model),
        check_dtype(dtype) if dtype else default_dtype(evidence.key),
        choice.setting,
        choice.stack,
        measurements,
        params or RooflineParams(),
    )
    check_runs_on(request.model.weights, request.spec)
    return with_modules(in_precision(sixteen_bit_source(request), request), request.evidence)


def sixteen_bit_source(request: SourceRequest) -> LatencyModel:
    """The source as the model's 16-bit layers are priced (see latency_source)."""
    evidence = request.evidence
    if request.setting == LatencySetting.DATASHEET:
        return request.datasheet()
    if request.given:
        return from_given(request)
    if not stack_names(evidence):
        return unmeasured_source(request)
    chosen = resolve_stack(evidence, request.stack)
    built = MEASURED_SOURCES.get(engine_of(chosen), from_grid)(request, chosen)
    if built is not None:
        return built
    fallback = unmeasured_source(request)
    stacks = len(stack_names(evidence))
    fallback.unmeasured = (
        f"no {request.dtype} measurements of {evidence.key} (its {stacks} measured stack(s) time other dtypes)"
    )
    return fallback


def in_precision(source: LatencyModel, request: SourceRequest) -> LatencyModel:
    """`source` with the model's quantized layers priced as their format runs them
    (perfmodel.latency.quantized) and its attention over an fp8 KV cache from the tables that
    measured one; one line where the device has none (an fp8 cache read at 16 bits would be
    priced at twice its bytes)."""
    model = request.model
    if model.weights is not None:
        source.quantized = QuantizedGemms.of(request.evidence, source.stack, model, source.params)
    if model.kv_cache is not None and model.mla is None:  # a latent-attention module's own tables hold its cache
        stack = source.attention.stack if source.attention is not None else None
        attention = attention_table(request.evidence, stack, request.dtype, model.kv_cache, model.head_dim)
        attention = attention or attention_table(request.evidence, None, request.dtype, model.kv_cache, model.head_dim)
        if attention is None:
            raise PerfkitError(
                f"kv cache {model.kv_cache}: no attention over an {model.kv_cache} KV cache of head size "
                f"{model.head_dim} is measured on {request.spec.key}; measured (head size {HEAD_DIM}) on: "
                f"{', '.join(kv_measured_devices(model.kv_cache)) or 'none'}"
            )
        source.attention = attention
    return source


def borrowable(spec: HardwareSpec) -> DeviceEvidence | None:
    """The evidence of a device of the same architecture with per-model profiles, if any."""
    if not getattr(spec, "architecture", None):
        return None
    for key, other in sorted(load_all_specs().items()):
        if key != spec.key and getattr(other, "architecture", None) == spec.architecture and stored_profiles(key):
            return device_evidence(other)
    return None


def borrowed(request: SourceRequest) -> LatencyModel | None:
    """The calibration of a measured device of its architecture (Vidur's profiles), where no
    engine was asked for."""
    if request.stack not in (None, AUTO_STACK, VIDUR):
        return None
    lender = borrowable(request.spec)
    table = stored_calibration(lender, request.dtype) if lender else None
    if table is None:
        return None
    return LatencyModel(
        request.spec, request.model, request.dtype, LatencyMode.BORROWED, table, None, table.params, stack=VIDUR
    )


def transferred(request: SourceRequest) -> LatencyModel | None:
    """An engine's GEMMs transferred from every device measured in it (vllm unless asked)."""
    spec, stack, dtype = request.spec, request.stack, request.dtype
    if stack == VIDUR:
        raise PerfkitError(f"--stack vidur: no device of {spec.key}'s architecture has Vidur's profiles")
    if stack is not None and stack.split("-")[0] == TORCH:
        raise PerfkitError(
            f"--stack {stack}: {spec.key} has no GPU campaign of this project's (python -m profilers.imports campaign "
            "FOLDER keeps one as its torch stack)"
        )
    engine = ENGINES[0] if stack in (None, AUTO_STACK) else stack.split("-")[0]
    if engine not in ENGINES:
        raise PerfkitError(f"--stack {stack}: choose from {', '.join((VIDUR, *ENGINES, TORCH))} (or a stack-version)")
    evidence = request.evidence
    transfer = evidence.derived(("transferred", engine, dtype), lambda: transferred_gemm(spec, engine, dtype))
    if transfer is None:
        return None
    params = evidence.derived(
        ("transferred_params", engine, dtype), lambda: fit_params(transfer.gemms(), spec, dtype, kind="transferred")
    )
    return LatencyModel(spec, request.model, dtype, LatencyMode.TRANSFERRED, params=params, stack=engine, grid=transfer)


# Who lends a device without measurements (of this dtype) its GEMM times, in the order auto
# tries them; the datasheet when none does. A new lender is one entry.
LENDERS: tuple[Callable[[SourceRequest], LatencyModel | None], ...] = (borrowed, transferred)


def unmeasured_source(request: SourceRequest) -> LatencyModel:
    """A device without measurements (of this dtype): the first of LENDERS that lends, else
    the datasheet; only `auto` may rest on another device's measurements."""
    if request.setting != LatencySetting.AUTO:
        raise PerfkitError(
            f"no {request.dtype} measurements of {request.spec.key} to give a {request.setting} latency; measured "
            f"devices: {', '.join(measured_devices()) or 'none'} (or use --latency datasheet)"
        )
    for lender in LENDERS:
        lent = lender(request)
        if lent is not None:
            return lent
    return request.datasheet()


def grid_params(grid: GemmGrid, spec: HardwareSpec) -> RooflineParams:
    """The roofline fitted to a grid, for the ops the grid does not time (elementwise work,
    attention without a measured table): over the points a decoding step meets (m up to 4096,
    n and k from 256)."""
    gemms = grid.gemms()
    gemms = gemms[(gemms["m"] <= 4096) & (gemms["n"] >= 256) & (gemms["k"] >= 256)]
    return fit_params(gemms, spec, grid.dtype)


def kv_measured_devices(kv_cache) -> list[str]:
    """Every device with measured attention over a KV cache of that format."""
    return [key for key in sorted(load_all_specs()) if attention_table(key, None, "bf16", kv_cache) is not None]


def measured_devices() -> list[str]:
    """Every device with GEMM measurements of some stack (per-model profiles or a grid)."""
    return [key for key, spec in sorted(load_all_specs().items()) if stack_names(device_evidence(spec))]


def decoder_latency(
    view: DeviceView, model: ModelConfig, dtype: str, source: str | LatencyChoice = "auto"
) -> LatencyModel:
    """The latency of the reference decoder's own kernels (its traced step): the device's
    torch stack, this project's campaign of torch's GEMMs and masked attention, where it has
    one and neither a stack, the datasheet nor this machine's own sweep was asked for; else
    view_latency's. Engine stacks price engines, whose kernels the decoder does not run."""
    choice = LatencyChoice.of(source)
    given = view.measured is not None and len(view.measured)
    if choice.stack is None and choice.setting != LatencySetting.DATASHEET and not view.is_cpu and not given:
        choice = LatencyChoice.of(choice, torch_stack(view.evidence))
    return view_latency(view, model, dtype, choice)


def view_latency(
    view: DeviceView, model: ModelConfig, dtype: str, source: str | LatencyChoice = "auto", stack: str | None = None
) -> LatencyModel:
    """The latency source of a resolved device (perfmodel.measured.device_view): a CPU is its measured
    ceilings' roofline (its own sweep when measured or calibrated is asked for); a GPU
    goes through latency_source with the view's efficiencies as its datasheet fallback."""
    choice = LatencyChoice.of(source, stack)
    if not view.is_cpu:
        measured = view.measured if view.measured is not None and len(view.measured) else None
        return latency_source(view.evidence, model, dtype, choice, measured, view.params)
    if model.weights is not None or model.kv_cache is not None:
        raise PerfkitError(
            f"{view.spec.key} is priced in 16 and 32 bits from its measured ceilings; {model.name}'s {model.precision} "
            "are priced on GPUs whose engines measured them"
        )
    if choice.setting in (LatencySetting.AUTO, LatencySetting.DATASHEET):
        return LatencyModel(view.spec, model, dtype, "datasheet", params=view.params)
    if view.measured is None or not len(view.measured):
        raise PerfkitError(f"{view.spec.key} has no measured sweep to give a {choice} latency")
    return latency_source(view.evidence, model, dtype, choice, view.measured, view.params)
