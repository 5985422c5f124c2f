"""The recorder of a traced step: a dispatch mode that turns every operator the decoder's step
dispatches on the meta device into a TraceRow (decoder.trace_ops says what each is), answers
what the step reads back to the host, and records the host's own work (views, module calls).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from decoder.medusa import STEP_PARTS
from decoder.trace_ops import (
    ATTENTIONS,
    COMPOSITE,
    COPY_INTO,
    KIND_OF,
    LOCAL_SCALAR,
    NO_KERNEL,
    ONE_KERNEL,
    POSITIONS,
    TO_COPY,
    attention_dims,
    dtype_name,
    encode_call,
    gemm_dims,
    moved_bytes,
    nbytes,
    on_device,
    op_name,
    shapes_text,
    tensors_in,
)
from perfmodel.latency.traced import TRACE_COLUMNS


@dataclass
class TraceRow:
    """One kernel of the step; the fields are TRACE_COLUMNS, in order."""

    step: str
    index: int
    part: str
    aten: str
    kind: str
    dtype: str
    batch: int = 1
    m: int = 0
    n: int = 0
    k: int = 0
    heads: int = 0
    kv_heads: int = 0
    q_len: int = 0
    kv_len: int = 0
    head_dim: int = 0
    flops: int = 0
    bytes: int = 0
    shapes: str = ""
    call: str = ""  # the call itself, replayable (encode_call)


ROW_VALUES = attrgetter(*TRACE_COLUMNS)  # a row's values in column order (dataclasses.astuple copies deeply: slow)


class HostLists(TorchFunctionMode):
    """torch.tensor(list, device=meta) is made on meta with no copy dispatched, where on a
    GPU it is a host-to-device copy: make it on the host and copy it, so the copy is traced."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.tensor and kwargs.get("device") is not None:
            device = kwargs.pop("device")
            return func(*args, **kwargs).to(device)
        return func(*args, **kwargs)


class StepRecorder(TorchDispatchMode):
    """Records every kernel the step launches on the meta device, as TraceRows.

    Run under torch.inference_mode (as the decoder's generate runs), the mode sees
    composite operators such as linear and matmul before torch decomposes them: it
    decomposes them itself, inside the mode, so a linear layer arrives as its mm. Fused
    attention and the composites a GPU runs as one kernel (trace_ops.ONE_KERNEL: RMSNorm) are
    the exception: one row each, their math on meta not traced."""

    def __init__(self, step: str, cold: frozenset[int] = frozenset()):
        super().__init__()
        self.step, self.part = step, STEP_PARTS[0]
        # Storages a step reads cold, streamed once since it last touched them: the model's
        # parameters (weight_storages) and, added by run_step, the KV cache.
        self.cold = set(cold)
        self.rows: list[TraceRow] = []
        # Per row, what repeats it: ("layer", i) inside decoder layer i, ("sequence", part, b)
        # in sequence b's verification or commit, else None (see repeated_runs).
        self.tags: list[tuple | None] = []
        self.tag: tuple | None = None
        self.unclassified: set[str] = set()  # operator names taken for elementwise by default
        # Tensors holding positions (argmax, ...) by id, kept alive so that no id is reused
        # (meta tensors cost no memory); a WeakSet would compare tensors with ==.
        self.positions: dict[int, torch.Tensor] = {}
        # Inside a composite operator's decomposition (linear's transpose and mm): its views are
        # the composite's own doing, in C++, not ops the host dispatches from Python.
        self.composite_depth = 0

    @contextmanager
    def phase(self, part: str) -> Iterator[None]:
        self.part = part
        yield

    @contextmanager
    def tagged(self, tag: tuple) -> Iterator[None]:
        self.tag = tag
        try:
            yield
        finally:
            self.tag = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket.__name__
        if packet in ATTENTIONS:
            out = func(*args, **kwargs)  # the mode is off in here: the math fallback goes untraced
            self._attention(func, args, kwargs, out)
            return out
        if packet in ONE_KERNEL:
            out = func(*args, **kwargs)  # as for attention: its decomposition here goes untraced
            self._kernel(func, packet, args, kwargs, tensors_in((args, kwargs)), tensors_in(out))
            return out
        synced = self._host_sync(func, args, kwargs)
        if synced is not None:
            return synced
        if func.has_kernel_for_dispatch_key(COMPOSITE):
            self.composite_depth += 1
            try:
                with self:  # linear, matmul, to, item, ...: their parts come back through this mode
                    return func.decompose(*args, **kwargs)
            finally:
                self.composite_depth -= 1
        out = func(*args, **kwargs)
        inputs, outputs = tensors_in((args, kwargs)), tensors_in(out)
        if not outputs or not on_device(inputs + outputs):
            return out
        if packet in NO_KERNEL:
            if any(id(t) in self.positions for t in inputs):
                self._hold_positions(outputs)  # a view of positions still holds positions
            if not self.composite_depth:
                self._host_only(op_name(func), "view", dtype_name(outputs[0].dtype))
            return out
        if packet in POSITIONS:
            self._hold_positions(t for t in outputs if not t.is_floating_point())
        self._kernel(func, packet, args, kwargs, inputs, outputs)
        return out

    def _hold_positions(self, tensors) -> None:
        self.positions.update((id(t), t) for t in tensors)

    # -- rows ----------------------------------------------------------------------------------

    def _add(
        self, func, call: tuple, kind: str, dtype: torch.dtype, inputs: list[torch.Tensor], note: str = "", **values
    ) -> None:
        self.tags.append(self.tag)
        self.rows.append(
            TraceRow(
                self.step,
                len(self.rows),
                self.part,
                op_name(func),
                kind,
                dtype_name(dtype),
                shapes=shapes_text(inputs) + note,
                call=encode_call(func, *call, self.cold),
                **values,
            )
        )

    def _host_only(self, name: str, kind: str, dtype: str = "") -> None:
        """A row of the host's work alone (perfmodel.latency.kinds.HOST_ONLY_KINDS): no kernel,
        nothing to replay."""
        self.tags.append(self.tag)
        self.rows.append(TraceRow(self.step, len(self.rows), self.part, name, kind, dtype))

    def module_call(self, module: torch.nn.Module) -> None:
        """An nn.Module called: the host's bookkeeping around its forward."""
        self._host_only(type(module).__name__, "module")

    def _kernel(self, func, packet: str, args: tuple, kwargs: dict, inputs: list[torch.Tensor], outputs: list):
        kind = KIND_OF.get(packet)
        if kind is None:
            self.unclassified.add(packet)
            kind = "elementwise"
        values = gemm_dims(packet, inputs, outputs[0]) if kind == "gemm" else {}
        values["bytes"] = moved_bytes(packet, args, inputs, outputs)
        # A host tensor (torch.tensor of a list, a numpy array) copied to the device.
        note = " host->device" if packet == "_to_copy" and not inputs[0].is_meta else ""
        self._add(func, (args, kwargs), kind, outputs[0].dtype, inputs, note=note, **values)

    def _attention(self, func, args: tuple, kwargs: dict, out) -> None:
        q, k, v = args[:3]
        output = tensors_in(out)[0]
        moved = nbytes(q) + nbytes(k) + nbytes(v) + nbytes(output)  # the scores never reach memory
        self._add(func, (args, kwargs), "attention", q.dtype, tensors_in(args), bytes=moved, **attention_dims(q, k))

    # -- reading back from the device -----------------------------------------------------------

    def _host_sync(self, func, args: tuple, kwargs: dict):
        """A read of device values by the host: recorded, and answered (None: not one)."""
        if func is LOCAL_SCALAR and args[0].is_meta:
            source = args[0]
            answer = self._host_value(source)
        elif func is TO_COPY and args[0].is_meta and kwargs.get("device") == torch.device("cpu"):
            source = args[0]
            answer = self._host_copy(source.shape, kwargs.get("dtype") or source.dtype)
        elif func is COPY_INTO and args[1].is_meta and not args[0].is_meta:
            source = args[1]
            answer = args[0].copy_(self._host_copy(args[0].shape, args[0].dtype))
        else:
            return None
        self._add(func, (args, kwargs), "host_sync", source.dtype, [source], bytes=nbytes(source))
        return answer

    def _host_value(self, source: torch.Tensor):
        """What a meta scalar reads as: 0 for a position (the first path, the first token),
        1 for any other integer (a count: the root is accepted), False, 0.0 (no draft
        passes a probability test): so every sequence accepts its root only."""
        if source.dtype == torch.bool:
            return False
        if source.is_floating_point():
            return 0.0
        return 0 if id(source) in self.positions else 1

    @staticmethod
    def _host_copy(shape, dtype: torch.dtype) -> torch.Tensor:
        """A device tensor copied to the host: zeros (indices, tokens, flags), or ones for
        floating values, a distribution torch.multinomial accepts (rejection sampling draws
        from the host copy)."""
        return torch.ones(shape, dtype=dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)


@contextmanager
def module_calls(recorder: StepRecorder, layers) -> Iterator[None]:
    """Record every nn.Module call as a host-only `module` row, and tag the rows each of
    `layers` (the decoder layers the step calls: the model's, or the fused forward's
    decoder.fused.FusedLayer) dispatches with ("layer", i), its own call's row included,
    through global module hooks (removed on leaving, so a decoder is traced again cleanly)."""
    layers = {id(layer): i for i, layer in enumerate(layers)}

    def enter(module, args):
        if id(module) in layers:
            recorder.tag = ("layer", layers[id(module)])
        recorder.module_call(module)

    def leave(module, args, output):
        if id(module) in layers:
            recorder.tag = None

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
