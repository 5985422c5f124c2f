"""What one operator call of a traced step is: its kind of kernel (the tables below), its
GEMM or attention dimensions, the bytes it moves, and the call itself as JSON that
profilers.kernel_replay runs again on real tensors. decoder.trace's recorder reads them.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

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
# On a GPU those run their kernels inside these, which torch.profiler shows as their own
# operators (a trace never sees them: they sit under the dispatcher).
ATTENTION_BACKENDS = frozenset("_efficient_attention_forward _flash_attention_forward _cudnn_attention_forward".split())
REDUCTIONS = frozenset(
    (
        "mean sum prod amax amin max min aminmax argmax argmin topk sort softmax _softmax log_softmax _log_softmax "
        "logsumexp cumprod cumsum var std var_mean std_mean multinomial all any norm linalg_vector_norm "
        "count_nonzero rms_norm _fused_rms_norm"
    ).split()
)
# Composite operators a GPU runs as one fused kernel (torch's RMSNorm: _fused_rms_norm on CUDA),
# whose decomposition runs elsewhere, the meta device included: recorded as that one kernel.
ONE_KERNEL = frozenset(("rms_norm",))
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
