"""EAGLE-style feature drafting (Li et al. 2024): one small decoder layer that drafts the
target's next feature from its current feature and the embedding of the token after it.

At position p the drafter reads (f_p, e(x_(p+1))): the target's final hidden state f_p and
the embedding of the token that follows, fused by fc: 2h -> h, runs one decoder layer (the
target's own layer shapes) and a norm, and predicts f_(p+1); the target's LM head reads the
token after that from it. Repeating this from the predicted feature drafts deeper tokens,
which is what makes EAGLE autoregressive where Medusa's heads all read the same state.
The drafter shares the target's embedding and LM head (not its own parameters).

Attention: the drafter sees a short window, not the whole prefix: the last CONTEXT accepted
positions' inputs and, in a tree, the node's draft ancestors. It is trained with the same
window (a sliding causal mask of CONTEXT + depth positions), so drafting sees what training
saw; the target's feature already carries the long context. EAGLE proper keeps a KV cache
of the drafter over the whole prefix; this keeps the drafter's cost independent of context
on a model whose features are its context's summary.

Drafting a static tree (a Tree of rank paths, as Medusa's): depth by depth, every node of
the depth above is run (with its ancestors and the context window), and each child takes
rank r of its parent's drafted distribution. `dynamic_eagle_tree` expands instead the most
confident nodes (EAGLE-2's rule) up to a token budget and depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch
from torch import nn

from decoder.model import DecoderLayer, LlamaConfig, RMSNorm, rope_cos_sin
from perfmodel.acceptance.trees import Tree, TreePath

CONTEXT = 4  # accepted positions the drafter attends to besides the tree
EAGLE_DEPTH = 5  # the dynamic tree's draft passes: the deepest the drafter is trained for
EAGLE_FILE = "eagle_drafter.safetensors"


class EagleLayout(StrEnum):
    """The drafter's layer as this project builds it, or as vLLM's EAGLE-1 drafter
    (vllm/model_executor/models/llama_eagle.py) runs one: fc without a bias, no input norm
    before the layer's attention, no norm after the layer, and attention over every earlier
    position (vLLM keeps the drafter's KV cache over the whole prefix), not a window."""

    PROJECT = "project"
    VLLM = "vllm"


EAGLE_FILES = {EagleLayout.PROJECT: EAGLE_FILE, EagleLayout.VLLM: "eagle_drafter_vllm.safetensors"}
EAGLE_CARDS = {EagleLayout.PROJECT: "eagle", EagleLayout.VLLM: "eagle_vllm"}  # its training.json entry


class EagleDrafter(nn.Module):
    def __init__(self, config: LlamaConfig, layout: EagleLayout = EagleLayout.PROJECT):
        super().__init__()
        h = config.hidden_size
        self.config, self.layout = config, EagleLayout(layout)
        vllm = self.layout is EagleLayout.VLLM
        self.fc = nn.Linear(2 * h, h, bias=not vllm)
        self.layer = DecoderLayer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        if vllm:
            self.layer.input_layernorm, self.norm = nn.Identity(), nn.Identity()
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    @property
    def window(self) -> int | None:
        """The positions it attends to (None: all earlier ones)."""
        return None if self.layout is EagleLayout.VLLM else CONTEXT

    def forward(self, features, embeddings, positions, mask=None) -> torch.Tensor:
        """Predicted next features (B, T, h) from features and next-token embeddings (B, T, h)
        at integer positions (B, T); mask (B, 1, T, T) bool, or None for causal."""
        x = self.fc(torch.cat([embeddings, features], dim=-1))
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        return self.norm(self.layer(x, cos, sin, None, 0, None, mask, 0))


def parameters_of(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def window_mask(length: int, window: int, device=None) -> torch.Tensor:
    """(1, 1, T, T) bool: causal, each position seeing itself and the window - 1 before it."""
    i = torch.arange(length, device=device)
    rel = i[:, None] - i[None, :]
    return ((rel >= 0) & (rel < window))[None, None]


@dataclass
class History:
    """Each sequence's last CONTEXT + 1 accepted (feature, token) pairs: the drafter's
    context window is the inputs (f_p, e(x_(p+1))) of the positions before the root's."""

    features: list[list[torch.Tensor]] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)

    @classmethod
    def empty(cls, batch: int) -> History:
        return cls([[] for _ in range(batch)], [[] for _ in range(batch)])

    def push(self, row: int, features: torch.Tensor, tokens: list[int]) -> None:
        # a copy: the decoder overwrites its last hidden state in place, and a view of it
        # kept here would become the next position's feature
        self.features[row] = (self.features[row] + list(features.clone()))[-(CONTEXT + 1) :]
        self.tokens[row] = (self.tokens[row] + list(tokens))[-(CONTEXT + 1) :]

    def inputs(self, row: int) -> tuple[list[torch.Tensor], list[int]]:
        """(features, next tokens) of the context positions, oldest first."""
        f, t = self.features[row], self.tokens[row]
        return f[:-1][-CONTEXT:], t[1:][-CONTEXT:]


def draft_tree(
    drafter: EagleDrafter,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    tree: Tree,
    root: int,
    root_feature: torch.Tensor,
    history: tuple[list[torch.Tensor], list[int]],
    position: int,
) -> torch.Tensor:
    """Candidate tokens (T,) of one sequence's static tree, root first. Depth by depth, the
    nodes down to that depth run with the context window before them (each seeing the window
    and its own ancestors), and every child takes rank r of its parent's drafted tokens and,
    as its input feature, the parent's drafted feature. position: the root's."""
    context = context_of(history, root_feature)
    info: dict[TreePath, tuple[int, torch.Tensor]] = {(): (root, root_feature)}
    for depth in range(tree.depth):
        needed = [(), *(p for p in tree.paths if len(p) <= depth)]
        drafted = dict(zip(needed, run_nodes(drafter, embed, context, needed, info, position)))
        children = [p for p in tree.paths if len(p) == depth + 1]
        wanted = max(p[-1] for p in children) + 1
        for parent in dict.fromkeys(p[:-1] for p in children):
            top = lm_head(drafted[parent]).topk(wanted).indices.tolist()
            for child in (p for p in children if p[:-1] == parent):
                info[child] = (top[child[-1]], drafted[parent])
    return torch.tensor([root] + [info[p][0] for p in tree.paths], dtype=torch.long, device=root_feature.device)


def context_of(history: tuple[list[torch.Tensor], list[int]], root_feature: torch.Tensor):
    """The context window's input features (C, h) and next tokens (C,) as tensors."""
    features, tokens = history
    stacked = torch.stack(features) if features else root_feature.new_zeros(0, root_feature.shape[-1])
    return stacked, torch.tensor(tokens, dtype=torch.long, device=root_feature.device)


def run_nodes(drafter, embed, context, paths: list[TreePath], info: dict, position: int) -> torch.Tensor:
    """The drafter's output features for `paths` (a set closed under ancestors, root () first),
    each node seeing the context window and its ancestors. info: path -> (token, input feature)."""
    ctx_f, ctx_t = context
    c = len(ctx_t)
    index = {p: i for i, p in enumerate(paths)}
    n = c + len(paths)
    device = ctx_f.device
    mask = torch.zeros(n, n, dtype=torch.bool, device=device)
    mask[:c, :c] = window_mask(c, c + 1, device)[0, 0]
    mask[c:, :c] = True
    for i, path in enumerate(paths):
        for cut in range(len(path) + 1):
            mask[c + i, c + index[path[:cut]]] = True
    tokens = torch.tensor([info[p][0] for p in paths], dtype=torch.long, device=device)
    feats = torch.stack([info[p][1] for p in paths])
    positions = torch.tensor([position + len(p) for p in paths], device=device)
    positions = torch.cat([torch.arange(position - c, position, device=device), positions])
    out = drafter(
        torch.cat([ctx_f, feats])[None],
        embed(torch.cat([ctx_t, tokens]))[None],
        positions[None],
        mask[None, None],
    )
    return out[0, c:]


@dataclass(frozen=True)
class DynamicDraft:
    """EAGLE-2's dynamic tree: the nodes it keeps, the expansions it drafts, and the top-k of each expansion."""

    nodes: int
    depth: int
    topk: int


def dynamic_eagle_tree(
    drafter: EagleDrafter,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    root: int,
    root_feature: torch.Tensor,
    history: tuple[list[torch.Tensor], list[int]],
    position: int,
    draft: DynamicDraft,
) -> tuple[Tree, torch.Tensor]:
    """EAGLE-2's dynamic tree for one sequence, as `draft` sizes it: `depth` expansions, each
    drafting the children of the `topk` most confident nodes of the depth above (confidence:
    the product of drafted probabilities along the path), keeping each one's top-k children;
    then the `nodes` most confident nodes of all drafted are the tree (a child is never more
    confident than its parent, so they form one). Returns the tree (paths of child ranks) and
    its tokens, root first, in the tree's order."""
    device = root_feature.device
    context = context_of(history, root_feature)
    info: dict[TreePath, tuple[int, torch.Tensor]] = {(): (root, root_feature)}
    score: dict[TreePath, float] = {(): 1.0}
    frontier: list[TreePath] = [()]
    for _ in range(draft.depth):
        needed = sorted({p[:cut] for p in frontier for cut in range(len(p) + 1)}, key=lambda p: (len(p), p))
        out = run_nodes(drafter, embed, context, needed, info, position)
        drafted = dict(zip(needed, out))
        children = []
        for parent in frontier:
            probs = torch.softmax(lm_head(drafted[parent]).float(), dim=-1)
            top = probs.topk(draft.topk)
            for rank, (p, token) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                child = parent + (rank,)
                info[child] = (token, drafted[parent])
                score[child] = score[parent] * p
                children.append(child)
        frontier = sorted(children, key=lambda p: -score[p])[: draft.topk]
    chosen = sorted((p for p in score if p), key=lambda p: (-score[p], len(p), p))[: draft.nodes]
    tree = Tree(tuple(chosen))
    tokens = torch.tensor([root] + [info[p][0] for p in tree.paths], dtype=torch.long, device=device)
    return tree, tokens


@dataclass(frozen=True)
class DraftPlan:
    """What drafting a static tree runs at each depth, worked out once per tree: the nodes
    run (those down to that depth, in the tree's order), the attention among them, the nodes
    expanded (the children's parents, each once: the LM head reads only these) and the
    children made from them (each child's parent's place among the nodes run and among those
    expanded, and its rank)."""

    tree: Tree
    runs: tuple[torch.Tensor, ...]
    masks: tuple[torch.Tensor, ...]
    expanded: tuple[torch.Tensor, ...]
    children: tuple[torch.Tensor, ...]
    parents: tuple[torch.Tensor, ...]
    slots: tuple[torch.Tensor, ...]
    ranks: tuple[torch.Tensor, ...]
    depths: torch.Tensor
    tops: tuple[int, ...] = ()  # per depth, the top-k its children need (their highest rank + 1)

    @classmethod
    def of(cls, tree: Tree, device="cpu") -> DraftPlan:
        depths = torch.as_tensor(tree.depths, device=device)
        ancestors = torch.as_tensor(tree.ancestor_mask, device=device)
        parents_of = torch.as_tensor(tree.parents, device=device)
        ranks_of = torch.tensor([-1] + [p[-1] for p in tree.paths], device=device)
        runs, masks, expanded, children, parents, slots, ranks = [], [], [], [], [], [], []
        for depth in range(tree.depth):
            run = torch.nonzero(depths <= depth).ravel()
            child = torch.nonzero(depths == depth + 1).ravel()
            place = torch.searchsorted(run, parents_of[child])  # run is sorted: the parent's column
            unique, slot = torch.unique(place, sorted=True, return_inverse=True)
            runs.append(run)
            masks.append(ancestors[run][:, run])
            expanded.append(unique)
            children.append(child)
            parents.append(place)
            slots.append(slot)
            ranks.append(ranks_of[child])
        tops = tuple(int(r.max()) + 1 for r in ranks)  # read here, once, not inside a step
        return cls(tree, *map(tuple, (runs, masks, expanded, children, parents, slots, ranks)), depths, tops)


def child_tokens(logits: torch.Tensor, slot: torch.Tensor, rank: torch.Tensor, top: int | None = None) -> torch.Tensor:
    """Each child's token (B, children): rank `rank` of its parent's drafted distribution, the
    parent `slot` among the nodes expanded, whose logits are (B, expanded, V). top: the
    top-k to take (rank.max() + 1, read from the device when not given)."""
    return logits.topk(top if top is not None else int(rank.max()) + 1, dim=-1).indices[:, slot, rank]


@dataclass(frozen=True)
class Window:
    """A batch's context windows, left-padded to the longest: input features (B, W, h), next
    tokens (B, W), which slots hold a position (B, W), their positions (B, W), and the causal
    mask among them."""

    features: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    causal: torch.Tensor

    @classmethod
    def of(cls, histories, root_features: torch.Tensor, positions: torch.Tensor) -> Window:
        """histories: each sequence's (features, next tokens) before its root, at most CONTEXT;
        positions (B,): the roots'."""
        batch, device = len(histories), root_features.device
        width = max((len(h[1]) for h in histories), default=0)
        ctx_f = root_features.new_zeros(batch, width, root_features.shape[-1])
        ctx_t = torch.zeros(batch, width, dtype=torch.long, device=device)
        valid = torch.zeros(batch, width, dtype=torch.bool, device=device)
        for b, (features, tokens) in enumerate(histories):
            if tokens:
                ctx_f[b, width - len(tokens) :] = torch.stack(features)
                ctx_t[b, width - len(tokens) :] = torch.tensor(tokens, device=device)
                valid[b, width - len(tokens) :] = True
        ctx_pos = positions[:, None] - torch.arange(width, 0, -1, device=device)[None, :]
        return cls(ctx_f, ctx_t, valid, ctx_pos, window_mask(width, width + 1, device)[0, 0])


def run_pass(drafter, embed, window: Window, features, tokens, positions, among) -> torch.Tensor:
    """One draft pass over the batch: nodes with input features (B, r, h), tokens (B, r) and
    positions (B, r), each seeing its sequence's window and the nodes `among` (r, r) allows.
    Returns the nodes' drafted features (B, r, h)."""
    batch, width = window.tokens.shape
    n = width + tokens.shape[1]
    mask = torch.zeros(batch, n, n, dtype=torch.bool, device=tokens.device)
    mask[:, :width, :width] = window.causal & window.valid[:, None, :]
    slots = torch.arange(width, device=tokens.device)  # on the device: capturable in a CUDA graph
    mask[:, slots, slots] = True  # a padded slot sees itself: no empty row
    mask[:, width:, :width] = window.valid[:, None, :]
    mask[:, width:, width:] = among
    out = drafter(
        torch.cat([window.features, features], dim=1),
        embed(torch.cat([window.tokens, tokens], dim=1)),
        torch.cat([window.positions, positions], dim=1),
        mask[:, None],
    )
    return out[:, width:]


def draft_batch(
    drafter: EagleDrafter,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    plan: DraftPlan,
    roots: torch.Tensor,
    root_features: torch.Tensor,
    positions: torch.Tensor,
    window: Window,
) -> torch.Tensor:
    """Candidate tokens (B, T) of every sequence's static tree, drafted together: per depth one
    drafter pass over the batch (context windows left-padded and masked), one LM head over the
    nodes expanded (each parent once) and one gather of the children's ranks. roots (B,),
    root_features (B, h), positions (B,) the roots' positions; `window` the sequences' context
    windows (Window.of a batch's histories; the static step keeps them as tensors). The same
    tokens as draft_tree, sequence by sequence."""
    size = plan.tree.size
    tokens = roots[:, None].repeat(1, size)
    feats = root_features[:, None, :].repeat(1, size, 1)
    steps = zip(plan.runs, plan.masks, plan.expanded, plan.children, plan.parents, plan.slots, plan.ranks, plan.tops)
    for run, among, expanded, child, parent, slot, rank, top in steps:
        at = positions[:, None] + plan.depths[run][None, :]
        out = run_pass(drafter, embed, window, feats[:, run], tokens[:, run], at, among)
        tokens[:, child] = child_tokens(lm_head(out[:, expanded]), slot, rank, top)
        feats[:, child] = out[:, parent]
    return tokens


def chain_hits(
    drafter: EagleDrafter,
    embed: nn.Embedding,
    lm_head: nn.Linear,
    features: torch.Tensor,
    tokens: torch.Tensor,
    first: int,
    depth: int,
    topk: int,
) -> torch.Tensor:
    """At every position t = first .. T - 2 of one decoded sequence (the target's features
    (T, h) and tokens (T,); `first` the prompt's last position), where a step whose root is
    x_(t+1) could start: whether the drafter's rank-i token at depth k + 1 is x_(t+k+2), the
    token that came, drafting the chain of the tokens that came (each node's input the
    drafted feature of its parent, as in draft_batch), with the context window the decoder
    has there (the accepted positions since `first`, at most CONTEXT). Returns (positions,
    depth, topk) floats: 1 hit, 0 miss, NaN where that token lies past the end. Greedy
    verification accepts a tree's path exactly where these hits lie along it, so a static
    tree's steps replay through them (perfmodel.acceptance.batching.accepted_lengths)."""
    length, device = len(tokens), features.device
    starts = list(range(first, length - 1))
    histories = []
    for t in starts:
        since = range(max(first, t - CONTEXT), t)
        histories.append(([features[q] for q in since], [int(tokens[q + 1]) for q in since]))
    at = torch.tensor(starts, device=device)
    window = Window.of(histories, features[at], at + 1)
    ahead = (at[:, None] + 1 + torch.arange(depth + 1, device=device)[None, :]).clamp(max=length - 1)
    chain_tokens = tokens[ahead]  # the root and the tokens that came after it
    chain_feats = features[at][:, None, :].repeat(1, depth + 1, 1)
    causal = window_mask(depth, depth + 1, device)[0, 0]
    hits = torch.full((len(starts), depth, topk), float("nan"), device=device)
    for j in range(depth):
        nodes = slice(0, j + 1)
        out = run_pass(
            drafter, embed, window, chain_feats[:, nodes], chain_tokens[:, nodes], ahead[:, nodes], causal[nodes, nodes]
        )
        top = lm_head(out[:, j]).topk(topk, dim=-1).indices
        came = at + j + 2
        inside = came < length
        hits[inside, j] = (top[inside] == tokens[came[inside], None]).float()
        chain_feats[:, j + 1] = out[:, j]
    return hits
