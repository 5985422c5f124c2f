"""A traced kernel inventory of one decoding step, on PyTorch's meta device.

The decoder's own step (decoder.medusa: candidates, tree forward, acceptance, KV update)
runs once on a weightless model whose tensors have shapes and no data, and every aten
operator it dispatches becomes a row: which part of the step, what kind of kernel, its
GEMM or attention dimensions, FLOPs and bytes moved. A 70B step traces in seconds with no
memory, so the inventory is the decoder's real kernel sequence at any model size, not a
model of it.

Meta tensors hold no values, so what the step reads back to the host (an `int(t)`, a
`.tolist()`) is answered here: a host_sync row, then a value that lets the step go on,
which makes every sequence accept its root only (see StepRecorder._host_value).

Every decoder layer launches the same kernels at the same shapes, and every sequence's
verification and commit the same ones too (each accepts its root only, at the same context):
trace_step traces a one-layer model verifying and committing one sequence, and repeats that
layer's rows num_layers times and that sequence's rows batch times, in place. The table is
the one an unrolled trace (trace_unrolled: every layer, every sequence) records, row for
row (tests/test_trace.py checks it), some 10 times faster (a llama-7b step in about 0.04 s
instead of 0.4 s on two cores), which lets a sweep trace hundreds of points; StepTracer
traces each point of a sweep once.

    python -m decoder.trace --model llama-7b --batch 1 --context 512 --tree-size 64 --csv trace.csv
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter

import numpy as np
import pandas as pd
import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from decoder.acceptance import ACCEPT, SCHEMES, AcceptanceConfig
from decoder.checkpoint import Checkpoint
from decoder.heads import MedusaHeads
from decoder.medusa import ROOT_ONLY, STEP_PARTS, Decoder, commit_path
from decoder.model import KVCache, LlamaConfig, Transformer
from decoder.static_step import StaticStep
from decoder.tree import TreeBuffers, tree_buffers
from perfmodel.acceptance.trees import Tree, greedy_tree, max_nodes
from perfmodel.base.dtypes import default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.outputs import writable_file, write_csv
from perfmodel.cli import Parser, options, run
from perfmodel.latency.kinds import KINDS, kernel_rows
from perfmodel.latency.traced import TRACE_COLUMNS
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.operators import HEAD_TOP_K

META = torch.device("meta")
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}

# Operators that launch no kernel on a GPU: views and metadata changes, allocations without
# a fill, and the wrappers torch puts around a constant.
NO_KERNEL = frozenset(
    (
        "view alias _unsafe_view _reshape_alias as_strided t transpose permute expand expand_as slice select "
        "narrow unsqueeze squeeze unsqueeze_ squeeze_ t_ transpose_ split split_with_sizes unbind chunk diagonal "
        "detach detach_ view_as movedim unfold _conj conj _neg_view resolve_conj resolve_neg "
        "empty empty_like empty_strided new_empty new_empty_strided lift_fresh lift_fresh_copy"
    ).split()
)
# Operator names (overload packets) by kind; attention and host syncs are recognised apart.
GEMMS = frozenset("mm addmm bmm baddbmm matmul".split())
ATTENTIONS = frozenset(
    (
        "scaled_dot_product_attention _scaled_dot_product_attention_math _scaled_dot_product_flash_attention "
        "_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_efficient_attention "
        "_scaled_dot_product_cudnn_attention"
    ).split()
)
REDUCTIONS = frozenset(
    (
        "mean sum prod amax amin max min aminmax argmax argmin topk sort softmax _softmax log_softmax _log_softmax "
        "logsumexp cumprod cumsum var std var_mean std_mean multinomial all any norm linalg_vector_norm "
        "count_nonzero"
    ).split()
)
INDEXING = frozenset(
    (
        "index index_put index_put_ _index_put_impl_ gather scatter scatter_ scatter_add scatter_add_ "
        "scatter_reduce scatter_reduce_ embedding index_select masked_select take index_copy index_copy_ "
        "index_add index_add_ masked_scatter masked_scatter_ nonzero"
    ).split()
)
COPIES = frozenset("copy_ clone cat stack _to_copy contiguous repeat flip roll".split())
ELEMENTWISE = frozenset(
    (
        "add add_ sub sub_ rsub mul mul_ div div_ neg neg_ rsqrt sqrt pow reciprocal exp exp2 log log2 log1p "
        "abs sign cos sin tanh sigmoid silu silu_ gelu relu erf floor ceil round trunc remainder fmod "
        "floor_divide eq ne lt le gt ge where clamp clamp_ clamp_min clamp_max minimum maximum isnan isinf "
        "nan_to_num logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_not "
        "bitwise_xor masked_fill masked_fill_ fill fill_ zero_ zeros zeros_like ones ones_like full full_like "
        "scalar_tensor arange rand rand_like randn uniform_ normal_ triu tril lerp addcmul addcdiv square"
    ).split()
)
KIND_OF = {
    **dict.fromkeys(ELEMENTWISE, "elementwise"),
    **dict.fromkeys(GEMMS, "gemm"),
    **dict.fromkeys(REDUCTIONS, "reduction"),
    **dict.fromkeys(INDEXING, "indexing"),
    **dict.fromkeys(COPIES, "copy"),
}
# Kernels that write some elements of a big tensor (a cache layer): they read the source
# and indices and write as many elements, not the whole destination.
PARTIAL_WRITES = frozenset(
    "scatter scatter_ scatter_add scatter_add_ scatter_reduce scatter_reduce_ index_put index_put_ "
    "_index_put_impl_ index_copy index_copy_ masked_scatter masked_scatter_".split()
)
# Kernels that read some rows of a table: each output element read and written, plus the indices.
GATHERS = frozenset("index gather embedding index_select take masked_select".split())
# In-place kernels that overwrite their destination without reading it.
OVERWRITES = frozenset("copy_ fill_ zero_".split())
# Whose integer outputs are positions in a tensor: read back, the trace answers them with 0.
POSITIONS = frozenset("argmax argmin topk sort max min multinomial nonzero".split())
LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default
TO_COPY = torch.ops.aten._to_copy.default
COPY_INTO = torch.ops.aten.copy_.default
COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


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


# -- what one operator call is -------------------------------------------------------------


def op_name(func) -> str:
    """`mm`, `mul.Tensor`: the aten name without its namespace, and without `.default`."""
    packet, overload = func.overloadpacket.__name__, func._overloadname
    return packet if overload == "default" else f"{packet}.{overload}"


def tensors_in(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def nbytes(t: torch.Tensor) -> int:
    """Bytes of memory behind a tensor: a broadcast (expanded, stride 0) dimension reads the
    same elements again, from cache, so it counts once (a KV write's index is (B, T) in
    memory, expanded over heads and head_dim)."""
    if t.numel() == 0:
        return 0
    return int(np.prod([n for n, stride in zip(t.shape, t.stride()) if stride != 0])) * t.element_size()


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def shapes_text(tensors: list[torch.Tensor]) -> str:
    return "x".join("[" + ",".join(map(str, t.shape)) + "]" for t in tensors)


def on_device(tensors: list[torch.Tensor]) -> bool:
    """Whether the call touches the traced device (meta): host-only work is no kernel."""
    return any(t.is_meta for t in tensors)


def gemm_dims(packet: str, inputs: list[torch.Tensor], out: torch.Tensor) -> dict:
    """batch, m, n, k of (batch x) m x k @ k x n; addmm and baddbmm carry the bias first."""
    left, right = inputs[1:3] if packet in ("addmm", "baddbmm") else inputs[:2]
    m, k, n = left.shape[-2], left.shape[-1], right.shape[-1]
    batch = out.numel() // (m * n)
    return dict(batch=batch, m=m, n=n, k=k, flops=2 * batch * m * n * k)


def attention_dims(q: torch.Tensor, k: torch.Tensor) -> dict:
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    flops = 4 * batch * heads * q_len * kv_len * head_dim
    return dict(batch=batch, heads=heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len, head_dim=head_dim, flops=flops)


def written_elements(packet: str, args: tuple, inputs: list[torch.Tensor]) -> int:
    """Elements a partial write stores into its destination."""
    if packet.startswith("scatter"):
        return args[2].numel()  # scatter(self, dim, index, ...): one element per index
    if packet.endswith("index_put_") or packet == "index_put":
        return torch.ops.aten.index.Tensor(args[0], args[1]).numel()  # meta: the shape alone
    return inputs[-1].numel()  # index_copy, masked_scatter: the source


def moved_bytes(packet: str, args: tuple, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """Bytes the kernel reads and writes: its inputs read and outputs written, except where
    that would count memory it does not touch. A partial write (a KV cache write or move)
    reads its source and indices and writes as many elements as it stores, not the whole
    destination; a gather reads as many table elements as it writes, plus the indices; copy_
    and fill_ write their destination without reading it."""
    if packet in PARTIAL_WRITES:
        return sum(map(nbytes, inputs[1:])) + written_elements(packet, args, inputs) * inputs[0].element_size()
    if packet in GATHERS:
        return 2 * sum(map(nbytes, outputs)) + sum(map(nbytes, inputs[1:]))
    if packet in OVERWRITES:
        return sum(map(nbytes, inputs[1:])) + sum(map(nbytes, outputs))
    return sum(map(nbytes, inputs)) + sum(map(nbytes, outputs))


def encode_call(func, args: tuple, kwargs: dict, cold) -> str:
    """The operator call as compact JSON, enough to run it again on real tensors
    (profilers.kernel_replay): [operator, args, kwargs], each tensor as {"t": shape,
    "s": strides, "d": dtype}, plus "w": 1 where its storage is in `cold` (a model weight
    or the KV cache: a step streams its weights and reads each layer's cache once, so a
    replay reads them cold) and "h": 1 for a host
    tensor; a dtype as {"dtype": name}, a device as {"device": null} (the replay's own) or
    {"device": "host"} (a copy back to the host)."""

    def encode(value):
        if isinstance(value, torch.Tensor):
            out = {"t": list(value.shape), "s": list(value.stride()), "d": str(value.dtype).removeprefix("torch.")}
            if value.untyped_storage()._cdata in cold:
                out["w"] = 1
            if not value.is_meta:
                out["h"] = 1
            return out
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"device": "host" if value.type == "cpu" else None}
        if isinstance(value, (torch.memory_format, torch.layout)):
            return {"enum": str(value).removeprefix("torch.")}
        if isinstance(value, (list, tuple)):
            return [encode(v) for v in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return {"unknown": repr(value)}

    named = {name: encode(value) for name, value in kwargs.items()}
    return json.dumps([str(func), encode(list(args)), named], separators=(",", ":"))


def weight_storages(modules) -> frozenset[int]:
    """The storages of every parameter of `modules` (None skipped), to tell weights apart."""
    return frozenset(p.untyped_storage()._cdata for m in modules if m is not None for p in m.parameters())


# -- the recorder --------------------------------------------------------------------------


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
    attention is the exception: one row, and its math fallback on meta is not traced."""

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


# -- the step -------------------------------------------------------------------------------


def llama_config(model: ModelConfig) -> LlamaConfig:
    """The decoder's config for a cost-model preset (shapes only: RoPE and norm constants
    are the defaults, which change no kernel)."""
    return LlamaConfig(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        num_key_value_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        max_position_embeddings=model.max_context or LlamaConfig.max_position_embeddings,
        tie_word_embeddings=model.tie_word_embeddings,
        medusa_num_heads=model.medusa_heads,
    )


def weightless_decoder(model: ModelConfig, dtype: torch.dtype, medusa: bool) -> Decoder:
    """A Decoder over a model (and, for Medusa, heads) built on meta: shapes, no weights."""
    config = llama_config(model)
    with torch.device(META):
        transformer = Transformer(config).to(dtype).eval()
        heads = MedusaHeads(config.hidden_size, config.vocab_size, model.medusa_heads).to(dtype) if medusa else None
    return Decoder(Checkpoint(None, config, transformer, heads, None, None, {}), str(META))


def head_accuracy(heads: int, topk: int) -> np.ndarray:
    """Head accuracies falling with depth and rank (a_k^(i) = 0.6^(k+1) / (i+1)): only the
    tree's shape depends on them, and any node count up to the complete tree is reachable."""
    return 0.6 ** np.arange(1, heads + 1)[:, None] / np.arange(1, topk + 1)[None, :]


def step_tree(candidates: int, heads: int, topk: int) -> Tree:
    """The static tree of a step: the root alone, or the greedy tree of `candidates` tokens."""
    if candidates == 1:
        return ROOT_ONLY
    return greedy_tree(head_accuracy(heads, topk), candidates - 1)


def check_step(model: ModelConfig, batch: int, context: int, candidates: int, dtype: str, acceptance: str) -> None:
    for name, value in (("batch", batch), ("context", context), ("tree size", candidates)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PerfkitError(f"{name} must be an integer >= 1, got {value!r}")
    if dtype not in TORCH_DTYPES:
        raise PerfkitError(f"the decoder runs {', '.join(TORCH_DTYPES)}; got dtype {dtype!r}")
    if acceptance not in ACCEPT:
        raise PerfkitError(f"unknown acceptance {acceptance!r}; choose one of: {', '.join(ACCEPT)}")
    if candidates > 1:
        if model.medusa_heads < 1:
            raise PerfkitError(f"{model.name} has no Medusa heads: only tree size 1 (plain decoding) can be traced")
        largest = max_nodes(model.medusa_heads, HEAD_TOP_K) + 1
        if candidates > largest:
            raise PerfkitError(
                f"tree size {candidates} is more than {model.name}'s {model.medusa_heads} Medusa heads x "
                f"top-{HEAD_TOP_K} allow: at most {largest} tokens"
            )
    model.check_context(context, candidates)


@contextmanager
def module_calls(decoder: Decoder, recorder: StepRecorder) -> Iterator[None]:
    """Record every nn.Module call as a host-only `module` row, and tag the rows each decoder
    layer dispatches with ("layer", i), its own call's row included, through global module
    hooks (removed on leaving, so a decoder is traced again cleanly)."""
    layers = {id(layer): i for i, layer in enumerate(decoder.model.model.layers)}

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


def run_step(
    decoder: Decoder,
    recorder: StepRecorder,
    static: TreeBuffers,
    batch: int,
    context: int,
    acceptance: str,
    sequences: int | None = None,
) -> None:
    """One iteration of Decoder.generate's loop, part by part, on a cache of `context`
    tokens per sequence; the verification and commit of the first `sequences` sequences
    only (None: all), each sequence's rows tagged ("sequence", part, b)."""
    config, dtype = decoder.model.config, next(decoder.model.parameters()).dtype
    topk = HEAD_TOP_K if decoder.heads is not None else 1
    cache = KVCache(config, batch, context + 2 * static.size + 1, META, dtype)
    recorder.cold |= {t.untyped_storage()._cdata for t in (cache.k, cache.v)}
    lengths, roots = [context] * batch, [0] * batch
    last_hidden = torch.empty(batch, config.hidden_size, device=META, dtype=dtype)
    accept, settings = ACCEPT[acceptance], AcceptanceConfig(scheme=acceptance)
    generator = torch.Generator().manual_seed(0)  # on the host, as generate's
    looped = range(batch if sequences is None else min(sequences, batch))
    with torch.inference_mode(), HostLists(), recorder, module_calls(decoder, recorder):
        with recorder.phase("candidates"):
            buffers, candidates = decoder._candidates(roots, last_hidden, static, 0, topk)
        with recorder.phase("forward"):
            hidden, logits = decoder._tree_forward(candidates, buffers, lengths, cache)
        verdicts = []
        with recorder.phase("verification"):
            for b in looped:
                with recorder.tagged(("sequence", "verification", b)):
                    verdicts.append(accept(candidates[b], logits[b], buffers[b], settings, generator))
        with recorder.phase("kv_update"):
            for b, (path, _) in zip(looped, verdicts):
                with recorder.tagged(("sequence", "kv_update", b)):
                    commit_path(cache, lengths, b, path, hidden, last_hidden, candidates)


def run_static_step(
    decoder: Decoder, recorder: StepRecorder, static: TreeBuffers, batch: int, context: int, acceptance: str
) -> None:
    """One static step (decoder.static_step) part by part, every sequence at `context` cached
    tokens, the cache allocated as generate allocates it (the step attends over all of it)."""
    topk = HEAD_TOP_K if decoder.heads is not None else 1
    settings = AcceptanceConfig(scheme=acceptance)
    step = StaticStep(decoder, static, batch, context + 2 * static.size + 1, settings, topk, Launch.STATIC, None)
    step.buffers.lengths.fill_(context)
    recorder.cold |= {t.untyped_storage()._cdata for t in (step.buffers.cache.k, step.buffers.cache.v)}
    with torch.inference_mode(), HostLists(), recorder, module_calls(decoder, recorder):
        with recorder.phase("candidates"):
            candidates = step.candidates()
        with recorder.phase("forward"):
            hidden, logits = step.forward(candidates)
        with recorder.phase("verification"):
            verdict = step.verify(candidates, logits)
        with recorder.phase("kv_update"):
            step.commit(candidates, hidden, verdict)


def record_step(
    decoder: Decoder,
    batch: int,
    context: int,
    candidates: int,
    acceptance: str,
    sequences: int | None,
    launch: Launch = Launch.EAGER,
    recorder: StepRecorder | None = None,
) -> StepRecorder:
    """The recorder of one step of `decoder` (built for the step: with heads for a tree), as
    the eager loop runs it or, for a static launch regime, as the static step does."""
    medusa = candidates > 1
    heads, topk = (len(decoder.heads), HEAD_TOP_K) if medusa else (0, 1)
    static = tree_buffers(step_tree(candidates, heads, topk), heads, topk, str(META))
    if recorder is None:
        recorder = StepRecorder("medusa" if medusa else "plain", weight_storages((decoder.model, decoder.heads)))
    if launch.static:
        run_static_step(decoder, recorder, static, batch, context, acceptance)
    else:
        run_step(decoder, recorder, static, batch, context, acceptance, sequences)
    return recorder


def trace_table(groups: list[tuple[list[tuple], int]], unclassified: set[str]) -> pd.DataFrame:
    """A trace table from runs of rows (TRACE_COLUMNS values), each repeated so many times in
    place, numbered in order: each distinct row is built once and the table taken from them
    (a batch of thousands of sequences repeats its verification rows thousands of times)."""
    distinct = pd.DataFrame([row for rows, _ in groups for row in rows], columns=list(TRACE_COLUMNS))
    starts = np.cumsum([0] + [len(rows) for rows, _ in groups])
    order = [np.tile(np.arange(start, start + len(rows)), times) for (rows, times), start in zip(groups, starts)]
    trace = distinct.take(np.concatenate(order or [np.empty(0, dtype=np.int64)])).reset_index(drop=True)
    trace["index"] = np.arange(len(trace), dtype=np.int64)
    trace.attrs["unclassified"] = sorted(unclassified)
    return trace


def repeated_runs(recorder: StepRecorder, layers: int, batch: int) -> list[tuple[list[tuple], int]]:
    """The runs of rows of a one-layer, one-sequence recording, each with how many times it
    stands in the step: its layer's `layers` times, each part's sequence rows `batch` times,
    the others once."""
    runs = []
    for tag, tagged in groupby(zip(recorder.tags, recorder.rows), key=lambda pair: pair[0]):
        times = 1 if tag is None else layers if tag[0] == "layer" else batch
        runs.append(([ROW_VALUES(row) for _, row in tagged], times))
    return runs


def one_layer(model: ModelConfig) -> ModelConfig:
    return dataclasses.replace(model, num_layers=1)


def trace_step(
    config: ModelConfig,
    batch: int,
    context: int,
    candidates: int,
    dtype: str = "fp16",
    acceptance: str = "greedy",
    launch: Launch = Launch.EAGER,
) -> pd.DataFrame:
    """Every kernel of one decoding step of `batch` sequences with `context` cached tokens
    each: plain decoding for candidates == 1, else a Medusa step over a tree of that many
    tokens. Columns TRACE_COLUMNS; attrs["unclassified"] lists operator names counted as
    elementwise only because no table names them. Traced on one layer and one sequence's
    verification, repeated (the module doc): the rows of trace_unrolled. launch: a static
    regime traces decoder.static_step's step (the batch at once) instead of the eager loop."""
    return StepTracer(acceptance, launch=launch)(config, batch, context, candidates, dtype)


def trace_unrolled(
    config: ModelConfig,
    batch: int,
    context: int,
    candidates: int,
    dtype: str = "fp16",
    acceptance: str = "greedy",
    launch: Launch = Launch.EAGER,
) -> pd.DataFrame:
    """trace_step's table traced the long way: every layer of the model, every sequence's
    verification and commit (the reference trace_step's repetition is checked against)."""
    check_step(config, batch, context, candidates, dtype, acceptance)
    decoder = weightless_decoder(config, TORCH_DTYPES[dtype], candidates > 1)
    recorder = record_step(decoder, batch, context, candidates, acceptance, sequences=None, launch=launch)
    return trace_table([([ROW_VALUES(row) for row in recorder.rows], 1)], recorder.unclassified)


class StepTracer:
    """trace_step for a sweep (perfmodel.latency.traced.Tracer): each (model, batch, context,
    candidates, dtype) traced once for the object's life (kept as the runs of one layer's
    and one sequence's rows with their repeats, a fraction of a table), and one weightless
    one-layer decoder per (model, dtype, heads or not) reused. beyond_context: trace contexts past the model's
    trained context too, as the sweeps price them (their beyond_context column marks such
    rows): a trace holds shapes, which do not depend on the trained length. launch: the
    regime whose step is traced (a static one: decoder.static_step's)."""

    def __init__(self, acceptance: str = "greedy", beyond_context: bool = False, launch: Launch = Launch.EAGER):
        self.acceptance, self.beyond_context = acceptance, beyond_context
        self.launch = Launch.parse(launch)
        self._decoders: dict[tuple, Decoder] = {}
        self._runs: dict[tuple, tuple[list[tuple[list[tuple], int]], set[str]]] = {}

    def __call__(
        self, config: ModelConfig, batch: int, context: int, candidates: int, dtype: str = "fp16"
    ) -> pd.DataFrame:
        if self.beyond_context:
            config = dataclasses.replace(config, max_context=None)
        point = (config, batch, context, candidates, dtype)
        if point not in self._runs:
            check_step(*point, self.acceptance)
            if self.launch.static:  # its KV move spans every layer at once: traced whole
                decoder = self._decoder(config, dtype, candidates > 1, layers=config.num_layers)
                recorder = record_step(decoder, batch, context, candidates, self.acceptance, None, self.launch)
                runs = [([ROW_VALUES(row) for row in recorder.rows], 1)]
            else:
                decoder = self._decoder(config, dtype, candidates > 1)
                recorder = record_step(decoder, batch, context, candidates, self.acceptance, 1, self.launch)
                runs = repeated_runs(recorder, config.num_layers, batch)
            self._runs[point] = runs, recorder.unclassified
        return trace_table(*self._runs[point])

    def _decoder(self, config: ModelConfig, dtype: str, medusa: bool, layers: int = 1) -> Decoder:
        built = (config, dtype, medusa, layers)
        if built not in self._decoders:
            shape = dataclasses.replace(config, num_layers=layers)
            self._decoders[built] = weightless_decoder(shape, TORCH_DTYPES[dtype], medusa)
        return self._decoders[built]


def host_only_text(trace: pd.DataFrame) -> str:
    """How many host-only ops beside the kernels: views and module calls."""
    counts = trace["kind"].value_counts()
    return f"{counts.get('view', 0)} views and {counts.get('module', 0)} module calls on the host alone"


def kernel_summary(trace: pd.DataFrame) -> pd.DataFrame:
    """Per step and kind (in KINDS order, every kind listed): kernels, bytes and FLOPs."""
    totals = trace.groupby(["step", "kind"], sort=False)[["index", "bytes", "flops"]].agg(
        kernels=("index", "size"), bytes=("bytes", "sum"), flops=("flops", "sum")
    )
    steps = list(dict.fromkeys(trace["step"]))
    grid = pd.MultiIndex.from_product([steps, KINDS], names=["step", "kind"])
    return totals.reindex(grid, fill_value=0).reset_index()


# -- command line ------------------------------------------------------------------------------


def build_parser() -> Parser:
    p = Parser(prog="python -m decoder.trace", description=__doc__.split("\n\n")[0])
    options.model(p)
    options.step_point(p, tree_default=64, tree_use="; the plain step is traced too")
    options.dtype(p, allowed=tuple(TORCH_DTYPES), default_said="fp16: the inventory is of a GPU's step")
    options.acceptance(p, choices=SCHEMES)
    options.csv(p, "every kernel of both steps")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    model = load_model(args.model)
    dtype = args.dtype or default_dtype("cuda")  # the inventory is of a GPU's step
    sizes = list(dict.fromkeys((1, args.tree_size)))  # the plain step, then the Medusa step
    for size in sizes:  # every refusal before any tracing
        check_step(model, args.batch, args.context, size, dtype, args.acceptance)
    if args.csv:
        writable_file(args.csv, "trace table (--csv)")
    traces = []
    for size in sizes:
        started = time.perf_counter()
        trace = trace_step(model, args.batch, args.context, size, dtype, args.acceptance)
        seconds = time.perf_counter() - started
        traces.append(trace)
        step = trace["step"].iloc[0]
        print(
            f"{model.name} {step} step, batch {args.batch}, context {args.context}, {size} token(s) per sequence, "
            f"{dtype}: {len(kernel_rows(trace))} kernels ({host_only_text(trace)}), traced in {seconds:.2f} s"
        )
        summary = kernel_summary(trace).drop(columns="step")
        print(summary.to_string(index=False, formatters={"bytes": "{:,}".format, "flops": "{:,}".format}))
        if trace.attrs["unclassified"]:
            print(f"  counted as elementwise, unknown: {', '.join(trace.attrs['unclassified'])}")
    if args.csv:
        write_csv(pd.concat(traces, ignore_index=True), args.csv)
        print(f"{args.csv}: {sum(map(len, traces))} rows")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
