"""What each operator of a decoding step costs: matmul shapes, FLOPs, bytes, intensity.

This is the single definition of every operator's shapes. The cost model counts them and
the profilers build their benchmark tensors from them, so the two cannot disagree.

Counting convention (paper Appendix G, Table 5; it reproduces the published intensities):
a matmul (M x K)·(K x N) costs 2·M·N·K FLOPs; bytes = element size x (each input read
once + the output written once). Attention is a batched matmul over b·n_kv key/value
heads whose query rows are the group's n/n_kv heads times the query length, so GQA reads
each K/V head once; K/V length is the context s in every phase (the paper's convention:
tree candidates attend to the s cached tokens).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.base.precision import KV_BYTES, WEIGHT_BYTES, KvFormat, WeightFormat
from perfmodel.models.config import ModelConfig
from perfmodel.models.kernels import Elementwise, FusedAttention, Matmul, OpCost, Operand, read, written
from perfmodel.models.mla_operators import LatentAttentionKernel, mla_kernels
from perfmodel.models.moe_operators import ExpertGemms, moe_kernels

OPS = ("q", "k", "v", "qkv", "qk", "pv", "o", "up", "gate", "gate_up", "down", "lm_head", "medusa_heads")
# Operators that are one GEMM against a weight: their time depends on the token count
# (batch x query length) and the weight's shape only.
LINEAR_OPS = ("q", "k", "v", "qkv", "o", "up", "gate", "gate_up", "down", "lm_head")
# Attention as one fused kernel (torch scaled_dot_product_attention with the causal or
# tree mask): measured beside the paper's plain qk/pv matmuls, reported as its own op.
FUSED_OPS = ("sdpa",)
# The rest of a decoding step: memory-bound elementwise work around the matmuls, and the
# Medusa tree's own overhead (candidate top-k, verification, moving accepted KV entries), and
# a drafter's top-k over the logits of the nodes it expands (EAGLE's children per pass).
STEP_OPS = (
    "embed",
    "norm",
    "add_norm",
    "rope",
    "kv_write",
    "act",
    "residual",
    "mask",
    "candidates",
    "verify",
    "kv_move",
    "draft_topk",
)
# Drafters' own weights beside the target's layer shapes: EAGLE's fc (and an MTP module's
# eh_proj) fuses the target's last feature and the sampled token's embedding, [f; e] (2h) -> h,
# before its one decoder layer. EAGLE-3 fuses three of the target's layers' features instead,
# [f_low; f_mid; f_high] (3h) -> h (`eagle3_fc`, on the target's features only), and its layer's
# q/k/v read the sampled token's embedding beside the feature, [e; f] (2h) (`eagle3_qkv`; vLLM's
# llama_eagle3.py, SGLang's llama_eagle3.py).
DRAFTER_OPS = ("eagle_fc", "eagle3_fc", "eagle3_qkv")
# A mixture-of-experts layer's MLP (perfmodel.models.moe): the router's GEMM (h -> experts), the
# engine's fused expert kernel (perfmodel.models.moe_operators) and a shared expert's gate_up and down.
MOE_OPS = ("router", "moe", "shared_expert")
# A latent-attention layer's attention as one module (perfmodel.models.mla_operators): its projections,
# attention and output projection, where a grouped-query layer runs qkv, rope, kv_write, sdpa and o.
MLA_OPS = ("mla",)
ALL_OPS = OPS + FUSED_OPS + STEP_OPS + DRAFTER_OPS + MOE_OPS + MLA_OPS
# Operators whose every kernel is a GEMM against a weight: latency sources time them as such.
WEIGHT_OPS = (*LINEAR_OPS, "medusa_heads", *DRAFTER_OPS, "router", "shared_expert")
DEFAULT_OPS = OPS + FUSED_OPS  # what sweeps and rooflines cover unless asked for more


class Phase(StrEnum):
    """Which tokens a step feeds through a sequence: its prompt (prefill), one token (decode) or
    the Medusa tree's candidates (tree). A str: it prints and writes as its name; code compares
    it with its members."""

    PREFILL = "prefill"
    DECODE = "decode"
    TREE = "tree"


PHASES = tuple(Phase)
# The paper's figure groups: XW_Q/XW_K/XW_V, QK^T/PV, XW_u/XW_g/XW_d.
OP_GROUPS = {"qkv": ("q", "k", "v"), "qk/pv": ("qk", "pv"), "up/gate/down": ("up", "gate", "down")}
ATTENTION_OPS = ("qk", "pv")
# The decoder layers' linear ops (an engine's fused names among them): what a quantized
# checkpoint stores in its weight format (perfmodel.base.precision). The LM head is not among them.
QUANTIZED_OPS = ("q", "k", "v", "qkv", "o", "up", "gate", "gate_up", "down", "moe", "shared_expert")

# The reference implementation takes each head's top-10 (its Vicuna trees use ranks 0..9),
# so heads are scored, trees built and candidates drawn over the same ten ranks.
HEAD_TOP_K = 10


# What a latent-attention module stands in for
GQA_ATTENTION_OPS = ("q", "k", "v", "qkv", "qk", "pv", "sdpa", "o")


def model_ops(model: ModelConfig, ops) -> tuple[str, ...]:
    """`ops` as the model runs them: an MoE model's expert layers run the router, the fused
    experts and any shared expert where a dense MLP runs up, gate and down, and a latent-attention
    model's layers its module where grouped-query attention runs q/k/v, attention and o (so a
    roofline of it draws those, not ops it does not have)."""
    ops = tuple(ops)
    if model.mla is not None and any(op in GQA_ATTENTION_OPS for op in ops):
        kept = tuple(op for op in ops if op not in GQA_ATTENTION_OPS)
        ops = (*MLA_OPS, *kept)
    mlp = ("up", "gate", "gate_up", "down")
    if model.moe is None or not any(op in mlp for op in ops):
        return ops
    experts = MOE_OPS if model.moe.shared_size else MOE_OPS[:2]
    kept = ops if model.dense_layers else tuple(op for op in ops if op not in mlp)
    return kept + tuple(op for op in experts if op not in kept)


def op_groups(model: ModelConfig) -> dict[str, tuple[str, ...]]:
    """The paper's figure groups as the model runs them: an MoE model's MLP group is its router
    and experts, a latent-attention model's attention groups its module (model_ops)."""
    groups = dict(OP_GROUPS)
    if model.mla is not None:
        groups = {"latent attention": MLA_OPS, **{g: ops for g, ops in groups.items() if g not in ("qkv", "qk/pv")}}
    if model.moe is None:
        return groups
    name = "up/gate/down/experts" if model.dense_layers else "router/experts"
    kept = {group: ops for group, ops in groups.items() if group != "up/gate/down"}
    return {**kept, name: model_ops(model, OP_GROUPS["up/gate/down"])}


def stored_format(model: ModelConfig, op: str) -> WeightFormat | None:
    """The format of an op's weights: an MoE model's experts' own where the checkpoint stores
    them apart (gpt-oss's mxfp4), the layers' quantized format for a quantized layer (a latent
    attention module's projections among them), else None (the dtype's)."""
    if op == "moe" and model.moe.experts_format is not None:
        return model.moe.experts_format
    return model.weights if op in (*QUANTIZED_OPS, *MLA_OPS) else None


def query_len(phase: str, seq_len: int, candidates: int) -> int:
    """Tokens each sequence feeds through the step: the prompt, one token, or the tree."""
    return {"prefill": seq_len, "decode": 1, "tree": candidates}[phase]


def check_point(op: str, phase: str, batch, seq_len, candidates) -> None:
    """Validate one grid point, or arrays of them (ints or numpy integer arrays)."""
    if op not in ALL_OPS:
        raise PerfkitError(f"unknown op {op!r}; choose from: {', '.join(ALL_OPS)}")
    if phase not in PHASES:
        raise PerfkitError(f"unknown phase {phase!r}; choose from: {', '.join(PHASES)}")
    for name, value in (("batch", batch), ("seq_len", seq_len), ("candidates", candidates)):
        array = np.asarray(value)
        if isinstance(value, bool) or array.dtype.kind not in "iu" or (array < 1).any():
            bad = array[array < 1].flat[0].item() if array.dtype.kind in "iu" else value
            raise PerfkitError(f"{name} must be a positive integer, got {bad!r}")
    if phase != Phase.TREE and (np.asarray(candidates) != 1).any():
        raise PerfkitError(f"candidates={candidates} applies to the tree phase only; {phase} uses 1")
    if op in (*FUSED_OPS, "mask") and phase == Phase.TREE and (np.asarray(candidates) > np.asarray(seq_len)).any():
        raise PerfkitError(
            f"{op}: the tree's {candidates} candidates are part of the {seq_len} attended tokens, so need candidates "
            "<= seq_len"
        )


Kernel = Matmul | FusedAttention | Elementwise | ExpertGemms | LatentAttentionKernel


def op_kernels(op: str, phase: str, model: ModelConfig, batch, seq_len, candidates=1) -> tuple[Kernel, ...]:
    """The kernels (matmuls, or one fused attention) that operator `op` runs in `phase`.

    batch, seq_len and candidates are ints, or numpy integer arrays of equal length.
    """
    check_point(op, phase, batch, seq_len, candidates)
    h, d, i = model.hidden_size, model.head_dim, model.intermediate_size
    q_width, kv_width = model.num_heads * d, model.num_kv_heads * d
    tokens = batch * query_len(phase, seq_len, candidates)

    def linear(k: int, n: int) -> Matmul:
        return Matmul(1, tokens, k, n, weight=True)

    if op in STEP_OPS:
        return (step_kernel(op, model, batch, seq_len, query_len(phase, seq_len, candidates)),)
    if op == "sdpa":
        # K/V length is s, as for qk/pv; in a tree step the last q of the s tokens are the tree.
        q_len = query_len(phase, seq_len, candidates)
        return (
            FusedAttention(
                batch, model.num_heads, model.num_kv_heads, q_len, seq_len, d, causal=phase == Phase.PREFILL
            ),
        )
    if op in ATTENTION_OPS:
        rows = model.group_size * query_len(phase, seq_len, candidates)
        heads = batch * model.num_kv_heads
        if op == "qk":
            return (Matmul(heads, rows, d, seq_len),)
        return (Matmul(heads, rows, seq_len, d),)
    if op in MOE_OPS:
        return moe_kernels(op, model, tokens)
    if op in MLA_OPS:  # seq_len: the attended tokens, the step's own among them (as for sdpa)
        return mla_kernels(model, phase == Phase.PREFILL, batch, query_len(phase, seq_len, candidates), seq_len)
    # The LM head and the heads' vocabulary projections are split over the vocabulary under
    # tensor parallelism (ModelConfig.vocab_per_device); their logits are gathered after.
    v_device = model.vocab_per_device
    if op == "medusa_heads":
        # Each head: a residual block h -> h (W1), then its own vocabulary projection (W2).
        return tuple(m for _ in range(model.medusa_heads) for m in (linear(h, h), linear(h, v_device)))
    shapes = {
        "q": (h, q_width),
        "k": (h, kv_width),
        "v": (h, kv_width),
        "qkv": (h, q_width + 2 * kv_width),
        "o": (q_width, h),
        "up": (h, i),
        "gate": (h, i),
        "gate_up": (h, 2 * i),
        "down": (i, h),
        "lm_head": (h, v_device),
        "eagle_fc": (2 * h, h),
        "eagle3_fc": (3 * h, h),
        "eagle3_qkv": (2 * h, q_width + 2 * kv_width),
    }
    return (linear(*shapes[op]),)


def step_operands(op: str, model: ModelConfig, batch, seq_len, q_len) -> dict[str, Operand]:
    """The tensors of a step op over batch x q_len tokens, in the decoder's layouts.

    K/V length for `mask` is seq_len (the tree's own tokens included, as for sdpa); the
    KV caches hold seq_len + q_len slots. `kv_move` counts the worst case of a whole
    depth-limited path moved in every layer. Small index tensors the decoder derives
    (positions, slots, tree buffers, the candidates' ids) are not counted.
    """
    h, i, d, v = model.hidden_size, model.intermediate_size, model.head_dim, model.vocab_size
    b, q, n, n_kv = batch, q_len, model.num_heads, model.num_kv_heads
    heads = max(model.medusa_heads, 1)
    if op == "embed":
        return {"ids": read(b, q), "table": Operand((v, h), reads=b * q * h), "out": written(b, q, h)}
    if op == "norm":
        return {"x": read(b, q, h), "weight": read(h), "out": written(b, q, h)}
    if op == "add_norm":
        # the residual add and the RMSNorm after it in one kernel: the sum is kept as the next
        # residual, and its norm is the output
        return {
            "x": read(b, q, h),
            "residual": read(b, q, h),
            "weight": read(h),
            "out": written(b, q, h),
            "residual_out": written(b, q, h),
        }
    if op == "rope":
        return {
            "q": read(b, n, q, d),
            "k": read(b, n_kv, q, d),
            "cos": read(b, 1, q, d),
            "sin": read(b, 1, q, d),
            "q_out": written(b, n, q, d),
            "k_out": written(b, n_kv, q, d),
        }
    if op in ("act", "residual"):
        width = i if op == "act" else h
        return {"x": read(b, q, width), "y": read(b, q, width), "out": written(b, q, width)}
    if op == "kv_write":
        cache = (1, b, n_kv, seq_len + q, d)
        return {
            "k": read(b, n_kv, q, d),
            "v": read(b, n_kv, q, d),
            "cache_k": Operand(cache, writes=b * n_kv * q * d),
            "cache_v": Operand(cache, writes=b * n_kv * q * d),
        }
    if op == "kv_move":
        cache = (model.num_layers, b, n_kv, seq_len + q, d)
        moved = model.num_layers * n_kv * d * b * np.minimum(q - 1, heads)
        return {"cache_k": Operand(cache, moved, moved), "cache_v": Operand(cache, moved, moved)}
    if op == "mask":
        return {"out": written(b, 1, q, seq_len)}
    if op == "candidates":
        return {"logits": read(heads, b, v), "top_tokens": written(heads, b, HEAD_TOP_K)}
    if op == "verify":
        return {"logits": read(b, q, v), "prediction": written(b, q)}
    if op == "draft_topk":
        return {"logits": read(b, q, v), "top_tokens": written(b, q, HEAD_TOP_K)}
    raise PerfkitError(f"{op!r} is not a step op; choose from: {', '.join(STEP_OPS)}")


def step_kernel(op: str, model: ModelConfig, batch, seq_len, q_len) -> Elementwise:
    """Element counts of the non-matmul work of a step over batch x q_len tokens: those
    of its operands (step_operands), and the math done on them."""
    h, i, d, v = model.hidden_size, model.intermediate_size, model.head_dim, model.vocab_size
    tokens = batch * q_len
    rotated = (model.num_heads + model.num_kv_heads) * d * tokens
    heads = max(model.medusa_heads, 1)
    operands = step_operands(op, model, batch, seq_len, q_len)
    flops = {
        "embed": 0,
        "norm": 4 * tokens * h,
        "add_norm": 5 * tokens * h,
        "rope": 3 * rotated,
        "kv_write": 0,
        "act": 5 * tokens * i,
        "residual": tokens * h,
        "mask": tokens * seq_len,
        "candidates": heads * batch * v,
        "verify": tokens * v,
        "kv_move": 0,
        "draft_topk": tokens * v,
    }
    reads = sum(o.reads for o in operands.values())
    writes = sum(o.writes for o in operands.values())
    return Elementwise(reads, writes, flops[op], operands)


def cached_elements(kernel: Kernel):
    """Elements of the KV cache an attention kernel reads: K^T of QK^T, V of PV (the right
    operands), K and V of a fused kernel."""
    if isinstance(kernel, FusedAttention):
        return kernel.batch * kernel.head_dim * 2 * kernel.kv_heads * kernel.kv_len
    if isinstance(kernel, LatentAttentionKernel):
        return kernel.cached_elements
    if not isinstance(kernel, Matmul) or kernel.weight:  # a projection reads no cache
        return 0
    return kernel.batch * kernel.k * kernel.n


def cost_of(
    kernels: tuple[Kernel, ...], dtype: str, weights: WeightFormat | None = None, kv_cache: KvFormat | None = None
) -> OpCost:
    """FLOPs and bytes of `kernels` in `dtype` (perfmodel.base.precision's formats: `weights` for
    a quantized linear op, whose weight GEMMs read their weight and activations at the format's
    bytes, scales counted, and write `dtype`; `kv_cache` for attention over a quantized cache,
    read at its bytes)."""
    size = element_bytes(dtype)
    moved = sum(kernel_bytes(k, size, weights, kv_cache) for k in kernels)
    return OpCost(flops=sum(k.flops for k in kernels), bytes=moved, kernels=len(kernels))


def kernel_bytes(kernel: Kernel, size: int, weights: WeightFormat | None, kv_cache: KvFormat | None):
    """Bytes one kernel moves (cost_of): an expert kernel's weights in their format and
    activations in 16 bits; a weight GEMM of a quantized op in the format; the rest at `size`,
    less what a quantized cache saves."""
    if isinstance(kernel, ExpertGemms):
        weight = size if weights is None else WEIGHT_BYTES[weights]
        return kernel.weight_elements * weight + kernel.activation_elements * size
    if weights is not None and isinstance(kernel, Matmul) and kernel.weight:
        k = kernel
        return k.batch * ((k.k * k.n + k.m * k.k) * WEIGHT_BYTES[weights] + k.m * k.n * size)
    moved = size * kernel.elements
    if kv_cache is not None:
        moved -= (size - KV_BYTES[kv_cache]) * cached_elements(kernel)
    return moved


def op_cost(
    op: str, phase: str, model: ModelConfig, dtype: str, batch: int, seq_len: int, candidates: int = 1
) -> OpCost:
    return cost_of(op_kernels(op, phase, model, batch, seq_len, candidates), dtype)
