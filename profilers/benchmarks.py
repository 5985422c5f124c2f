"""Operator microbenchmarks built from perfmodel.models.operators, never from a copy of the shapes.

Each kernel of an op becomes real torch work on tensors of exactly the counted shapes:
a linear layer is torch.mm of (m, k) activations by a (k, n) weight, attention the
batched matmuls torch.bmm the paper times, and `sdpa` one scaled_dot_product_attention
call with the causal mask (prefill) or the tree mask (tree decoding).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from decoder.acceptance import AcceptanceConfig, greedy
from decoder.eagle_batch import child_tokens
from decoder.heads import MedusaHeads
from decoder.medusa import build_candidates, commit_path
from decoder.model import KVCache, LlamaConfig, RMSNorm, apply_rope, rope_cos_sin
from decoder.tree import tree_attention_mask as decoder_tree_mask  # the decoder's batched mask, not the benchmark's
from decoder.tree import tree_buffers
from perfmodel.acceptance.trees import Tree
from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import ModelConfig
from perfmodel.models.operators import (
    HEAD_TOP_K,
    Elementwise,
    FusedAttention,
    Kernel,
    Matmul,
    Phase,
    op_kernels,
    query_len,
)

BENCH_DTYPES = ("fp16", "bf16", "fp32")
# Step operands a step reads from memory, not from the kernel before it: norm and table weights,
# the KV cache.
STEP_MEMORY_OPERANDS = ("weight", "table", "cache_k", "cache_v")


def check_bench_dtype(dtype: str) -> str:
    if dtype not in BENCH_DTYPES:
        raise PerfkitError(
            f"operator benchmarks run in {', '.join(BENCH_DTYPES)}; {dtype!r} is measured as a ceiling only"
        )
    return dtype


def torch_dtype(dtype: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[check_bench_dtype(dtype)]


def tree_attention_mask(q_len: int, kv_len: int, device: str):
    """(q_len, kv_len) bool mask: every query sees the kv_len - q_len cached tokens, and
    among the last q_len (the tree itself) only its ancestors and itself."""
    import torch

    mask = torch.ones(q_len, kv_len, dtype=torch.bool)
    tree = Tree.breadth_first(q_len - 1)
    mask[:, kv_len - q_len :] = torch.from_numpy(tree.ancestor_mask)
    return mask.to(device)


def workspace_elements(kernel: Kernel) -> int:
    """Extra elements a kernel allocates while running (SDPA's math path holds the scores
    and, for GQA, expanded K/V); 0 for matmuls writing into a preallocated output."""
    if isinstance(kernel, FusedAttention):
        scores = 2 * kernel.batch * kernel.heads * kernel.q_len * kernel.kv_len
        expanded_kv = 2 * kernel.batch * (kernel.heads - kernel.kv_heads) * kernel.kv_len * kernel.head_dim
        return scores + expanded_kv
    return 0


@dataclass(frozen=True)
class OpBenchmark:
    model: ModelConfig
    op: str
    phase: str
    batch: int
    seq_len: int
    candidates: int
    dtype: str
    device: str

    @property
    def kernels(self) -> tuple[Kernel, ...]:
        return op_kernels(self.op, self.phase, self.model, self.batch, self.seq_len, self.candidates)

    def operand_bytes(self) -> int:
        """Bytes of one set of operands (inputs and outputs)."""
        return element_bytes(self.dtype) * sum(k.elements for k in self.kernels)

    def bytes_needed(self, copies: int = 1) -> int:
        size = element_bytes(self.dtype)
        return copies * self.operand_bytes() + size * max(workspace_elements(k) for k in self.kernels)

    def build(self, copies: int = 1, weights: dict | None = None) -> list[OpRun]:
        """One runnable per operand copy, each running every kernel of the op.

        `weights` caches weight tensors across benchmarks of one op, so a sweep does not
        re-create a 500 MB weight for every batch size; activations are made per benchmark.
        """
        import torch

        dtype, device = torch_dtype(self.dtype), self.device
        weights = {} if weights is None else weights

        def new(shape: tuple[int, ...], fill: bool = True):
            t = torch.empty(shape, dtype=dtype, device=device)
            return fill_random(t) if fill else t

        def weight(shape: tuple[int, ...], index: int, copy: int):
            """A (k, n) weight stored as nn.Linear stores it, (n, k) row-major, and seen
            transposed: the layout real models run (it changes CPU GEMM speed 2.5x)."""
            key = (self.dtype, shape, index, copy)  # per kernel: Medusa heads each read their own
            if key not in weights:
                weights[key] = new(shape[::-1])
            return weights[key].t()

        def kernel_run(kernel: Kernel, index: int, copy: int) -> KernelRun:
            if isinstance(kernel, FusedAttention):
                return self._attention_run(kernel, new)
            if isinstance(kernel, Elementwise):
                return self._step_run(kernel, new, weight)
            a = new(kernel.left_shape)
            b = weight(kernel.right_shape, index, copy) if kernel.weight else new(kernel.right_shape)
            out = new(kernel.out_shape, fill=False)
            mm = torch.mm if kernel.weight else torch.bmm
            return KernelRun(kernel, {"a": a, "b": b, "out": out}, lambda: mm(a, b, out=out))

        runs = [OpRun([kernel_run(k, i, copy) for i, k in enumerate(self.kernels)]) for copy in range(copies)]
        if self.op == "medusa_heads":
            for run in runs:
                run.call = self._heads_module(run.kernels, new)
        return runs

    def _heads_module(self, kernels: list[KernelRun], new) -> Callable[[], object]:
        """The Medusa heads as the reference implementation runs them (decoder.heads: per
        head a ResBlock with bias, SiLU and residual, then the vocabulary projection, the
        logits stacked), on the very operands of the counted matmuls: the same FLOPs and
        bytes, plus the per-head module and elementwise work a real step pays."""
        import torch

        m = self.model
        with torch.device("meta"):
            heads = MedusaHeads(m.hidden_size, m.vocab_size, m.medusa_heads)
        state = {}
        for k in range(m.medusa_heads):
            w1, w2 = kernels[2 * k].operands["b"], kernels[2 * k + 1].operands["b"]
            state[f"{k}.0.linear.weight"] = w1.t()  # back to nn.Linear's (out, in) storage
            state[f"{k}.0.linear.bias"] = new((m.hidden_size,))
            state[f"{k}.1.weight"] = w2.t()
        heads.load_state_dict(state, assign=True)
        return functools.partial(heads, kernels[0].operands["a"])

    def _attention_run(self, k: FusedAttention, new) -> KernelRun:
        import torch.nn.functional as F

        q = new((k.batch, k.heads, k.q_len, k.head_dim))
        key, value = (new((k.batch, k.kv_heads, k.kv_len, k.head_dim)) for _ in range(2))
        operands = {"q": q, "k": key, "v": value}
        gqa = k.heads != k.kv_heads
        if self.phase == Phase.PREFILL:
            return KernelRun(
                k, operands, lambda: F.scaled_dot_product_attention(q, key, value, is_causal=True, enable_gqa=gqa)
            )
        mask = tree_attention_mask(k.q_len, k.kv_len, self.device) if self.phase == Phase.TREE and k.q_len > 1 else None
        return KernelRun(
            k,
            {**operands, "mask": mask},
            lambda: F.scaled_dot_product_attention(q, key, value, attn_mask=mask, enable_gqa=gqa),
        )

    def _step_run(self, kernel: Elementwise, new, weight) -> KernelRun:
        """The rest of a decoding step, run by the reference decoder's own code on tensors
        of the shapes the cost model counts (kernel.operands, from step_operands)."""
        import torch
        import torch.nn.functional as F

        m, b, s = self.model, self.batch, self.seq_len
        q = query_len(self.phase, s, self.candidates)
        h, d, heads = m.hidden_size, m.head_dim, max(m.medusa_heads, 1)
        op, device = self.op, self.device
        shape = {name: tuple(int(n) for n in operand.shape) for name, operand in kernel.operands.items()}
        if op == "embed":
            ids = torch.randint(0, m.vocab_size, shape["ids"], device=device)
            table = weight(shape["table"][::-1], 0, 0).t()  # stored (vocab, hidden), as nn.Embedding does
            return KernelRun(kernel, {"ids": ids, "table": table}, lambda: F.embedding(ids, table))
        if op == "norm":
            x, norm = new(shape["x"]), RMSNorm(shape["weight"][0], 1e-6).to(device, torch_dtype(self.dtype))
            return KernelRun(kernel, {"x": x, "weight": norm.weight}, lambda: norm(x))
        if op == "add_norm":
            # the same math as an engine's fused kernel, as this harness's torch runs it
            x, r = new(shape["x"]), new(shape["residual"])
            norm = RMSNorm(shape["weight"][0], 1e-6).to(device, torch_dtype(self.dtype))

            def add_norm():
                total = x + r
                return norm(total), total

            return KernelRun(kernel, {"x": x, "residual": r, "weight": norm.weight}, add_norm)
        if op == "rope":
            xq, xk = new(shape["q"]), new(shape["k"])
            batch, _, tokens, dim = shape["cos"]
            cos, sin = rope_cos_sin(torch.arange(tokens, device=device).expand(batch, -1), dim, 10000.0, xq.dtype)
            return KernelRun(
                kernel,
                {"q": xq, "k": xk, "cos": cos, "sin": sin},
                lambda: (apply_rope(xq, cos, sin), apply_rope(xk, cos, sin)),
            )
        if op in ("residual", "act"):
            x, y = new(shape["x"]), new(shape["y"])
            return KernelRun(kernel, {"x": x, "y": y}, (lambda: x + y) if op == "residual" else (lambda: F.silu(x) * y))
        config = LlamaConfig(m.vocab_size, h, m.intermediate_size, 1, m.num_heads, m.num_kv_heads, head_dim=d)
        buffers = tree_buffers(Tree.breadth_first(q - 1, HEAD_TOP_K), heads, HEAD_TOP_K, device)
        if op in ("kv_write", "kv_move"):
            layers, batch, _, slots, _ = shape["cache_k"]
            cache = KVCache(
                dataclasses.replace(config, num_hidden_layers=layers), batch, slots, device, torch_dtype(self.dtype)
            )
            caches = {"cache_k": cache.k, "cache_v": cache.v}
        if op == "kv_write":
            positions = (s + torch.arange(q, device=device)).expand(b, -1)
            k, v = new(shape["k"]), new(shape["v"])
            return KernelRun(kernel, {"k": k, "v": v, **caches}, lambda: cache.write(0, positions, k, v))
        if op == "kv_move":
            # Every sequence keeps the tree's longest path (at most one token per head past
            # the root): its KV entries move in every layer, as the decoder commits a step.
            path = max(([i for i in row if i >= 0] for row in buffers.retrieve.tolist()), key=len)
            hidden, last_hidden = new((b, q, h)), new((b, h))
            tokens = torch.randint(0, m.vocab_size, (b, q), device=device)

            def commit():
                lengths = [s] * b
                for row in range(b):
                    commit_path(cache, lengths, row, path, hidden, last_hidden, tokens)

            return KernelRun(kernel, caches, commit)
        if op == "mask":
            batch, _, tokens, kv_len = shape["out"]
            lengths = torch.full((batch,), kv_len - tokens, device=device)
            tree_mask = buffers.mask.expand(batch, -1, -1)
            positions = lengths[:, None] + buffers.depths
            return KernelRun(
                kernel,
                {},
                lambda: (
                    decoder_tree_mask(lengths, tree_mask, kv_len),
                    rope_cos_sin(positions, d, 10000.0, torch.float32),
                ),
            )
        if op == "candidates":
            logits = new(shape["logits"])
            roots = [0] * logits.shape[1]
            return KernelRun(
                kernel, {"logits": logits}, lambda: build_candidates(roots, logits, [buffers] * len(roots), HEAD_TOP_K)
            )
        if op == "draft_topk":
            # every node expanded drafts children up to rank HEAD_TOP_K - 1, as a wide EAGLE tree does
            logits = new(shape["logits"])
            slot, rank = torch.arange(q, device=device), torch.full((q,), HEAD_TOP_K - 1, device=device)
            return KernelRun(kernel, {"logits": logits}, lambda: child_tokens(logits, slot, rank))
        # verify: greedy acceptance of every row's tree from its logits
        logits = new(shape["logits"])
        tokens = torch.randint(0, m.vocab_size, logits.shape[:2], device=device)
        config_ = AcceptanceConfig()
        return KernelRun(
            kernel,
            {"logits": logits},
            lambda: [greedy(tokens[r], logits[r], buffers, config_) for r in range(len(tokens))],
        )


@dataclass(frozen=True)
class KernelRun:
    """One kernel's operands (by name) and the call that runs it on them."""

    kernel: Kernel
    operands: dict
    run: Callable[[], object]

    def activations(self) -> list:
        """The operands a step hands this kernel from the kernel before it, in cache there: a
        linear layer's input rows, attention's queries and mask, an elementwise op's inputs;
        not weights, the embedding table or the KV cache, which a step reads from memory."""
        if isinstance(self.kernel, Matmul):
            names = ("a",) if self.kernel.weight else ("a", "b")
        elif isinstance(self.kernel, FusedAttention):
            names = ("q", "mask")
        else:
            names = tuple(n for n in self.operands if n not in STEP_MEMORY_OPERANDS)
        return [self.operands[n] for n in names if self.operands.get(n) is not None]


class OpRun:
    """Every kernel of an op on one copy of its operands; calling it runs them in order,
    or runs `call` where the op runs its kernels through a model's own module."""

    def __init__(self, kernels: list[KernelRun], call: Callable[[], object] | None = None):
        self.kernels = kernels
        self.call = call

    def __call__(self) -> None:
        if self.call is not None:
            self.call()
            return
        for kernel in self.kernels:
            kernel.run()

    def warm(self) -> None:
        """Read every activation operand (KernelRun.activations), so that a sample timed next
        finds them in cache as the op does in a step, right after the op that wrote them."""
        for kernel in self.kernels:
            for tensor in kernel.activations():
                tensor.sum()


def fill_random(t):
    """Fill with standard-normal values (uninitialised memory may hold NaNs or denormals
    that slow CPUs). On the CPU a 1M-element random block is tiled: normal_() runs at
    ~0.5 GB/s there, which would make a sweep spend minutes creating weights."""
    import torch

    if t.device.type != "cpu" or t.numel() <= 1 << 20:
        return t.normal_()
    flat = t.view(-1)
    block = torch.randn(1 << 20, dtype=t.dtype)
    for start in range(0, flat.numel(), block.numel()):
        stop = min(start + block.numel(), flat.numel())
        flat[start:stop].copy_(block[: stop - start])
    return t
