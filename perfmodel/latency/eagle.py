"""EAGLE's step: a tree drafted depth by depth by one small layer, then verified at once.

EAGLE (Li et al. 2024) drafts at the feature level: its fc fuses the target's last hidden
feature and the embedding of the token just sampled, [f; e(x)] (2h) -> h (the op
`eagle_fc`), one decoder layer of the target's own shapes predicts the next feature, and
the target's LM head reads tokens from it. The features of one depth are the inputs of the
next, so a tree of depth d costs d sequential draft passes, where Medusa's heads draft in
one parallel pass inside the step. The target then verifies the tree in one step with tree
attention, as it verifies Medusa's, without heads (StepModel(with_heads=False)).

The tree priced (`DraftShape`) is EAGLE-2's top-k expansion (Li et al. 2024, "EAGLE-2";
its reference code's topK_generate): pass 1 runs over the root and drafts its top-k
children; every later pass runs over the k best nodes of the depth before, each drafting
its top-k children; after d passes the n - 1 drafts with the best path scores, reranked,
form the tree verified with its root. For a tree of n tokens (root included):

    d = min(depth, n - 1),  w_1 = 1,  w_j = min(top_k, n - 1) for j = 2..d
    T_eagle(b, s, n) = sum_j T_pass(b, s, w_j) + T_verify(b, s, n)

T_pass runs over w_j tokens per sequence: the embedding, the fc, one layer (norms, q/k/v,
RoPE, KV write, attention over the s cached tokens plus the draft's tokens so far, o,
residuals, gate/up, SiLU, down), the LM head and the top-k over its logits (priced as
verification's read of the same logits). T_verify is the tree step of n tokens without the
heads. Every op goes through the step's latency source (op_time, phase "tree", candidates
= the pass's tokens). Not counted: pass 1 also runs over the tokens the last step accepted
(the draft's KV cache catches up): it is priced as the root's one token.

Flavours: `paper` drafts with the paper's simplified layer and, like the paper's step,
leaves out the LM head (as it leaves out Medusa's heads); the paper's step is one layer
standing for each of the model's L, so a draft pass, one more layer, costs 1/L of it.
`full` as above. `traced`: the verification is the traced step less its candidates part
(perfmodel.latency.traced.DRAFT_PARTS); the draft is priced from the full inventory of one
layer by the same latency source (the decoder's EAGLE drafting is not traced).

Tensor parallel: the draft layer is split as the model's layers are, with its two
all-reduces per pass over the pass's tokens; its fc and the LM head as the target's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from perfmodel.base.errors import PerfkitError
from perfmodel.latency.allreduce import tp_comm_time_per_step
from perfmodel.latency.step import LatencySource, StepOp, check_flavor, layer_ops
from perfmodel.latency.tensor_parallel import TensorParallelStep
from perfmodel.models.config import ModelConfig

# EAGLE-2's defaults in its reference code and in Spec-Bench's runs of it (top_k 10, depth 5
# after the root's pass: 6 draft passes); the acceptance preset was measured with them.
EAGLE_TOP_K = 10
EAGLE_DEPTH = 6


@dataclass(frozen=True)
class DraftShape:
    """The tree EAGLE drafts for a budget of n tokens: its depth (draft passes) and the
    nodes each pass after the first expands (top-k expansion, module doc)."""

    depth: int = EAGLE_DEPTH
    top_k: int = EAGLE_TOP_K

    def __post_init__(self) -> None:
        for name in ("depth", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PerfkitError(f"EAGLE's draft {name} must be an integer >= 1, got {value!r}")

    def depths(self, candidates, depth=None) -> np.ndarray:
        """Draft passes of a tree of n tokens: min(depth, n - 1), 0 for plain decoding (a tree
        of n tokens is at most n - 1 deep)."""
        d = np.asarray(self.depth if depth is None else depth, dtype=np.int64)
        if (d < 1).any():
            raise PerfkitError(f"EAGLE's draft depth must be >= 1, got {d.min()}")
        return np.minimum(d, np.asarray(candidates, dtype=np.int64) - 1)

    def pass_tokens(self, candidates, depth=None) -> list[np.ndarray]:
        """Tokens per sequence of each pass j = 1, 2, ... (0 where the tree has no pass j)."""
        n = np.asarray(candidates, dtype=np.int64)
        d = self.depths(n, depth)
        width = np.clip(n - 1, 1, self.top_k)  # pass 1 drafts from the root alone
        return [np.where(d >= j, 1 if j == 1 else width, 0) for j in range(1, int(d.max(initial=0)) + 1)]

    def describe(self) -> str:
        return (
            f"EAGLE-2's top-k expansion: min({self.depth}, n - 1) draft passes of one layer and the LM head, the "
            f"first over the root, each later one over the top-{self.top_k} nodes of the depth before (at most n - 1)"
        )


EAGLE2_SHAPE = DraftShape()


def draft_pass_ops(model: ModelConfig, flavor: str) -> tuple[StepOp, ...]:
    """The ops of one draft pass over its tokens (module doc): the paper's layer, or one
    layer of the model's shapes with the embedding, EAGLE's fc, the LM head and the top-k."""
    check_flavor(flavor)
    if flavor == "paper":
        return layer_ops(model, "paper")
    one_layer = dataclasses.replace(model, num_layers=1)
    # The top-k over a pass's logits reads them as verification reads the tree's: its op prices it.
    return (*layer_ops(one_layer, flavor), StepOp("eagle_fc"), StepOp("lm_head"), StepOp("verify", label="draft_topk"))


@dataclass(frozen=True)
class EagleStep:
    """Step latency with EAGLE drafting: its draft passes plus the verification step
    (module doc). Speaks StepModel's step_time, so speedup_table prices it as it prices a
    Medusa step. verify: the step model verifying the tree (with_heads=False), its
    all-reduces included; model and latency: the shard the draft layer is a layer of and
    its latency source; flavor: the draft's inventory (paper or full)."""

    verify: object
    model: ModelConfig
    latency: LatencySource
    flavor: str = "full"
    shape: DraftShape = EAGLE2_SHAPE
    tp: int = 1
    all_reduce: object | None = None  # perfmodel.latency.allreduce source; None when tp == 1
    dtype: str = "fp16"

    def __post_init__(self) -> None:
        check_flavor(self.flavor)

    @property
    def label(self) -> str:
        return getattr(self.verify, "label", None) or self.latency.label

    def pass_time(self, batch, seq_len, tokens, drafted) -> np.ndarray:
        """Seconds of one draft pass over `tokens` tokens per sequence, with `drafted` draft
        tokens (this pass's included) cached beside the seq_len context (arrays broadcast)."""
        total = np.zeros(np.broadcast(batch, seq_len, tokens, drafted).shape)
        for item in draft_pass_ops(self.model, self.flavor):
            attended = seq_len + drafted if item.kv else seq_len
            total += item.count * np.asarray(self.latency.op_time(item.op, "tree", batch, attended, tokens), float)
        if self.tp > 1:
            one_layer = dataclasses.replace(self.model, num_layers=1)
            total += tp_comm_time_per_step(one_layer, self.tp, batch * tokens, self.dtype, self.all_reduce)
        return total

    def draft_time(self, batch, seq_len, candidates, depth=None) -> np.ndarray:
        """Seconds of drafting a tree of `candidates` tokens (root included) at the points
        given (broadcast arrays); depth: the tree's (default the shape's, at most n - 1)."""
        b, s, n = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (batch, seq_len, candidates)))
        out, drafted = np.zeros(b.shape), np.zeros(b.shape, dtype=np.int64)
        for tokens in self.shape.pass_tokens(n, None if depth is None else np.broadcast_to(depth, b.shape)):
            drafted = drafted + tokens
            on = tokens > 0
            out[on] += self.pass_time(b[on], s[on], tokens[on], drafted[on])
        # The paper's step is one layer standing for each of the model's: a pass is 1/L of it.
        return out / self.model.num_layers if self.flavor == "paper" else out

    def step_time(self, batch, seq_len, candidates=1, depth=None) -> np.ndarray:
        """Seconds per step: drafting (none for plain decoding) plus the verification."""
        verify = np.asarray(self.verify.step_time(batch, seq_len, candidates), dtype=float)
        return verify + self.draft_time(batch, seq_len, candidates, depth)

    def overhead(self, batch, seq_len, candidates, depth=None) -> np.ndarray:
        return self.step_time(batch, seq_len, candidates, depth) / self.step_time(batch, seq_len, 1)


def without_heads(step: TensorParallelStep) -> TensorParallelStep:
    """The step verifying a tree drafted outside it: its shard step with_heads=False (a
    traced one keeps its traces: the two price the same trace tables)."""
    return dataclasses.replace(step, shard_step=dataclasses.replace(step.shard_step, with_heads=False))


def eagle_step(step: TensorParallelStep, shape: DraftShape = EAGLE2_SHAPE) -> EagleStep:
    """EAGLE's step on the shard, latency source and all-reduces of a step flavour (a
    perfmodel.planning.step_models one): a traced flavour drafts with the full inventory."""
    shard = step.shard_step
    flavor = "full" if shard.flavor == "traced" else shard.flavor
    verify = without_heads(step)
    return EagleStep(verify, shard.model, shard.latency, flavor, shape, step.tp, step.all_reduce, step.dtype)
