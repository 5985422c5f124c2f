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

This toolkit's reference decoder drafts differently (decoder.eagle_batch.draft_batch), and
`StaticTreeDraft` prices what it runs: a static tree, no draft KV cache, so pass j runs the
last W accepted positions (its context window) and every node down to depth j again, its
attention over those tokens only, and the LM head reads the nodes pass j expands, each once
(Tree.draft_passes); the closed loop (perfmodel.validate --drafter eagle) checks it.

Flavours: `paper` drafts with the paper's simplified layer and, like the paper's step,
leaves out the LM head (as it leaves out Medusa's heads); the paper's step is one layer
standing for each of the model's L, so a draft pass, one more layer, costs 1/L of it.
`full` as above. `traced`: the verification is the traced step less its candidates part
(perfmodel.latency.traced.DRAFT_PARTS); the draft is priced from the full inventory of one
layer by the same latency source (the decoder's EAGLE drafting is not traced).

Tensor parallel: the draft layer is split as the model's layers are, with its two
all-reduces per pass over the pass's tokens; its fc and the LM head as the target's.

Other feature-level drafters draft the same way with other weights (DraftWeights,
perfmodel.latency.draft_weights): EAGLE-3's head (a 3h fc on the first pass, 2h q/k/v, its own
reduced vocabulary) and a checkpoint's MTP module (EAGLE's pass with the module's norms).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from perfmodel.acceptance.trees import Tree
from perfmodel.base.checks import is_count
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.latency.draft_weights import EAGLE_WEIGHTS, DraftWeights, latency_for
from perfmodel.latency.step import LatencySource, StepFlavor, StepOp, check_flavor, distinct_points
from perfmodel.latency.step_cost import DraftsThenVerifies, StepCost
from perfmodel.latency.tensor_parallel import TensorParallelStep
from perfmodel.latency.traced_step import TracedStep
from perfmodel.models.config import ModelConfig

# EAGLE-2's defaults in its reference code and in Spec-Bench's runs of it (top_k 10, depth 5
# after the root's pass: 6 draft passes); the acceptance preset was measured with them.
EAGLE_TOP_K = 10
EAGLE_DEPTH = 6


@dataclass(frozen=True)
class DraftPass:
    """One sequential draft pass at each point (arrays), per sequence: `tokens` run through the
    draft layer (0 where the tree has no such pass) and `expanded`, the nodes whose logits
    the LM head and the top-k read."""

    tokens: np.ndarray
    expanded: np.ndarray


@dataclass(frozen=True)
class DraftShape:
    """The tree EAGLE drafts for a budget of n tokens: its depth (draft passes) and the
    nodes each pass after the first expands (top-k expansion, module doc). The drafter keeps
    a KV cache: a pass attends to the context and the drafts so far, and writes its own."""

    depth: int = EAGLE_DEPTH
    top_k: int = EAGLE_TOP_K
    cached = True

    def __post_init__(self) -> None:
        for name in ("depth", "top_k"):
            value = getattr(self, name)
            if not is_count(value):
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

    def passes(self, candidates, depth=None) -> list[DraftPass]:
        """Each pass expands every token it runs."""
        return [DraftPass(tokens, tokens) for tokens in self.pass_tokens(candidates, depth)]

    def describe(self) -> str:
        if self.top_k == 1:
            depth = f"min({self.depth}, n - 1)"
            return f"a chain: {depth} draft passes of one layer and the LM head, each over the node before"
        return (
            f"EAGLE-2's top-k expansion: min({self.depth}, n - 1) draft passes of one layer and the LM head, the "
            f"first over the root, each later one over the top-{self.top_k} nodes of the depth before (at most n - 1)"
        )


EAGLE2_SHAPE = DraftShape()
# A pass priced as a step of its own (EagleStep.pass_step) runs the embedding, the layer, the
# final norm and the LM head in that step; the head's own ops beside it are priced apart.
STEPPED_APART = ("eagle_fc", "eagle3_fc", "draft_topk")


@dataclass(frozen=True)
class StaticTreeDraft:
    """Static trees drafted without a draft KV cache, as the reference decoder drafts them
    (decoder.eagle_batch.draft_batch): pass j runs the `window` last accepted positions and every
    node down to depth j (Tree.draft_passes), attending among those alone, and expands the
    parents of depth j + 1 (module doc). trees: the tree of every size priced.

    cached: drafted with a draft KV cache instead, as EAGLE-1 drafts its static tree
    (mc_sim_7b_63 by default): pass j runs the nodes at depth j alone (the root in the first),
    attending to the context and the drafts so far, and expands those with children (no window)."""

    trees: tuple[Tree, ...]
    window: int
    cached: bool = False

    def __post_init__(self) -> None:
        if not is_count(self.window, 0):
            raise PerfkitError(f"the draft's context window must be an integer >= 0, got {self.window!r}")
        if self.cached and self.window:
            raise PerfkitError(f"a drafter with a KV cache runs no window of accepted positions, got {self.window}")
        sizes = [t.size for t in self.trees]
        if len(set(sizes)) != len(sizes):
            raise PerfkitError(f"one tree per size: got sizes {sorted(sizes)}")

    def tree(self, size: int) -> Tree:
        for tree in self.trees:
            if tree.size == size:
                return tree
        have = ", ".join(str(t.size) for t in sorted(self.trees, key=lambda t: t.size))
        raise PerfkitError(f"no static tree of {size} tokens to draft; the trees priced have {have} tokens")

    def depths(self, candidates, depth=None) -> np.ndarray:
        """Each tree's own depth (0 for plain decoding)."""
        if depth is not None:
            raise PerfkitError("a static tree's depth is its own: do not pass depth")
        n = np.asarray(candidates, dtype=np.int64)
        return np.vectorize(lambda size: 0 if size == 1 else self.tree(int(size)).depth, otypes=[np.int64])(n)

    def passes(self, candidates, depth=None) -> list[DraftPass]:
        n = np.asarray(candidates, dtype=np.int64)
        d = self.depths(n, depth)
        work = {int(size): self.pass_work(self.tree(int(size))) for size in np.unique(n[n > 1])}
        out = []
        for j in range(int(d.max(initial=0))):
            run = [work[int(size)][j] if size > 1 and j < d_i else (0, 0) for size, d_i in zip(n.ravel(), d.ravel())]
            tokens = np.array([r + self.window if r else 0 for r, _ in run], dtype=np.int64).reshape(n.shape)
            expanded = np.array([e for _, e in run], dtype=np.int64).reshape(n.shape)
            out.append(DraftPass(tokens, expanded))
        return out

    def pass_work(self, tree: Tree) -> tuple[tuple[int, int], ...]:
        """(nodes run, nodes expanded) of each pass: every node down to depth j without a cache
        (Tree.draft_passes), the nodes at depth j alone with one."""
        if not self.cached:
            return tree.draft_passes
        at_depth = np.bincount(tree.depths, minlength=tree.depth + 1)
        return tuple((1 if j == 0 else int(at_depth[j]), expanded) for j, (_, expanded) in enumerate(tree.draft_passes))

    def describe(self) -> str:
        if self.cached:
            return (
                "static trees drafted with a draft KV cache (EAGLE-1's): pass j runs the nodes at depth j, the root "
                "first, and expands those with children"
            )
        return (
            f"static trees drafted without a draft KV cache: pass j runs the last {self.window} accepted positions "
            "and every node down to depth j, and expands the parents of depth j + 1"
        )


def draft_pass_ops(
    model: ModelConfig, flavor: str, cached: bool = True, weights: DraftWeights = EAGLE_WEIGHTS, first: bool = True
) -> tuple[StepOp, ...]:
    """The ops of one draft pass of the drafter `weights` over the target's shard `model`
    (perfmodel.latency.draft_weights.DraftWeights.pass_ops: EAGLE's by default)."""
    return weights.pass_ops(model, flavor, cached, first)


def pass_calls(ops, cached: bool, batch, seq_len, work: DraftPass, drafted):
    """(step op, phase, batch, seq_len, candidates) of every op call of one draft pass at the
    points given (arrays, every one with tokens > 0): `candidates` are the pass's tokens, or
    the nodes it expands; a cached drafter attends to the context and the drafted tokens so
    far (`drafted`, this pass's included), one without a cache to the pass's tokens alone."""
    for item in ops:
        rows = work.expanded if item.tokens == "expanded" else work.tokens
        if cached:
            keys = seq_len + drafted if item.kv else seq_len
        else:
            keys = work.tokens
        yield item, "tree", batch, keys, rows


def draft_calls(model: ModelConfig, flavor: str, shape, points, depth=None, weights: DraftWeights = EAGLE_WEIGHTS):
    """(pass, step op, phase, batch, seq_len, candidates, where) of every op call of drafting
    the trees at the points given ((batch, seq_len, candidates), broadcast arrays) by the
    drafter `weights`: which points it runs at and a mask of the points it belongs to. What
    drafting runs needs no latency source: the closed loop lists the calls it must time from
    this, and EagleStep prices them."""
    b, s, n = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in points))
    drafted = np.zeros(b.shape, dtype=np.int64)
    first, later = (draft_pass_ops(model, flavor, shape.cached, weights, first) for first in (True, False))
    for index, work in enumerate(shape.passes(n, None if depth is None else np.broadcast_to(depth, b.shape))):
        ops = first if index == 0 else later
        drafted = drafted + work.tokens
        on = work.tokens > 0
        if not on.any():
            continue
        here = DraftPass(work.tokens[on], work.expanded[on])
        for call in pass_calls(ops, shape.cached, b[on], s[on], here, drafted[on]):
            yield (index, *call, on)


def draft_points(model: ModelConfig, flavor: str, shape, batch, seq_len, candidates) -> list[tuple]:
    """The distinct (op, phase, batch, seq_len, candidates) points drafting runs its ops at, in
    order of first call: what timing the drafts takes."""
    return distinct_points(call[1:] for call in draft_calls(model, flavor, shape, (batch, seq_len, candidates)))


@dataclass(frozen=True)
class EagleStep(DraftsThenVerifies):
    """Step latency with EAGLE drafting: its draft passes plus the verification step
    (module doc). Speaks StepModel's step_time, so speedup_table prices it as it prices a
    Medusa step. verify: the step model verifying the tree (with_heads=False), its
    all-reduces included; model and latency: the shard the draft layer is a layer of and
    its latency source; flavor: the draft's inventory (paper, full or reference); shape: the
    trees drafted (DraftShape, EAGLE-2's; StaticTreeDraft, the reference decoder's). Split
    over devices (a TensorParallelStep verifying), the draft layer runs on the same devices:
    its passes take the verification's collectives."""

    verify: StepCost
    model: ModelConfig
    latency: LatencySource
    flavor: str = "full"
    shape: DraftShape | StaticTreeDraft = EAGLE2_SHAPE
    weights: DraftWeights = EAGLE_WEIGHTS
    # Where the verification is a traced step in a launch regime (eager or static: through the
    # host and device queues; graph: every kernel a CUDA-graph node), each pass is priced as a
    # step of its own in that regime: the reference decoder's step of the head's one-layer
    # model over the pass's tokens, and the head's fc and top-k from their ops.
    pass_step: StepCost | None = None

    def __post_init__(self) -> None:
        check_flavor(self.flavor)

    @property
    def pass_latency(self) -> LatencySource:
        """The latency source pricing a draft pass: the target's, on the head's own shapes
        where its config gives them (perfmodel.latency.draft_weights.latency_for)."""
        if self.weights.layer is None:
            return self.latency
        return latency_for(self.latency, self.weights.pass_model(self.model))

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        """The target's prefill (the drafter's one layer over the prompt is left out: under
        a 32-layer target's thirty-second)."""
        return self.verify.prefill_time(batch, prompt_len, medusa)

    def pass_times(self, batch, seq_len, candidates, depth=None) -> list[np.ndarray]:
        """Seconds of each draft pass at the points given (broadcast arrays; 0 where a tree has
        no such pass), its all-reduces included."""
        b, n = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (batch, seq_len, candidates)))[::2]
        work = self.shape.passes(n, None if depth is None else np.broadcast_to(depth, n.shape))
        times = [np.zeros(n.shape) for _ in work]
        calls = draft_calls(self.model, self.flavor, self.shape, (batch, seq_len, candidates), depth, self.weights)
        latency = self.pass_latency
        for index, item, phase, bb, s, q, where in calls:
            if self.pass_step is None or item.op in STEPPED_APART:
                times[index][where] += item.count * np.asarray(latency.op_time(item.op, phase, bb, s, q), float)
        if self.pass_step is not None:
            self.add_stepped_passes(times, work, b, np.broadcast_to(np.asarray(seq_len, dtype=np.int64), b.shape))
        split = self.verify if isinstance(self.verify, TensorParallelStep) and self.verify.tp > 1 else None
        layers = self.weights.pass_model(self.model).num_layers
        if split is not None:
            for index, draft in enumerate(work):
                on = draft.tokens > 0
                times[index][on] += split.layers_comm_time(b[on] * draft.tokens[on], layers=layers)
                # the LM head's logits of the expanded nodes, split over the vocabulary
                times[index][on] += split.rows_gather_time(b[on] * draft.expanded[on])
        return times

    def add_stepped_passes(self, times, work, batch, seq_len) -> None:
        """Each pass's step (pass_step) added to `times`: a pass of w tokens per sequence as
        the head's step of w tokens (a tree step without heads where w > 1) over the step's
        context. The drafts so far (a tree's depth x top-k tokens at most) are left out of the
        context a pass attends to: each distinct context would be a trace of its own, and they
        change one layer's attention over hundreds of tokens by a few percent."""
        for index, draft in enumerate(work):
            on = draft.tokens > 0
            if on.any():
                step = self.pass_step.step_time(batch[on], seq_len[on], draft.tokens[on])
                times[index][on] += np.asarray(step, dtype=float)

    def draft_time(self, batch, seq_len, candidates, depth=None) -> np.ndarray:
        """Seconds of drafting a tree of `candidates` tokens (root included) at the points
        given (broadcast arrays); depth: the tree's (default the shape's, at most n - 1)."""
        total = sum(
            self.pass_times(batch, seq_len, candidates, depth), np.zeros(np.broadcast(batch, seq_len, candidates).shape)
        )
        # The paper's step is one layer standing for each of the model's: a pass is 1/L of it.
        return total / self.model.num_layers if self.flavor == StepFlavor.PAPER else total

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


def eagle_step(
    step: TensorParallelStep, shape: DraftShape = EAGLE2_SHAPE, weights: DraftWeights = EAGLE_WEIGHTS
) -> EagleStep:
    """The step of a feature-level drafter (EAGLE's by default; `weights`: EAGLE-3's, an MTP
    module's) on the shard, latency source and all-reduces of a step flavour (a
    perfmodel.planning.step_models one): a traced flavour drafts with the full inventory, or,
    launched in a regime (eager, static, graph), pass by pass as the head's own traced steps in it
    (EagleStep.pass_step)."""
    shard = step.shard_step
    flavor = StepFlavor.FULL if shard.flavor == StepFlavor.TRACED else shard.flavor
    verify = without_heads(step)
    passes = None
    if isinstance(shard, TracedStep) and shard.regime in (Launch.EAGER, Launch.STATIC, Launch.GRAPH):
        passes = dataclasses.replace(shard, model=weights.pass_model(shard.model), with_heads=False, _cache={})
    return EagleStep(verify, shard.model, shard.latency, flavor, shape, weights, passes)
