"""A static Medusa step: the whole batch's step as fixed-shape tensor ops, run eagerly, from a
CUDA graph, or compiled (perfmodel.base.launch).

What decoder.medusa's step does sequence by sequence (Python loops, `.tolist()` reads in
acceptance and commit), this does over the batch with no host read inside the step, as
serving engines and gpt-fast run theirs: every buffer is allocated once per (batch, tree)
and updated in place, the per-sequence lengths live on the device, attention runs over the
whole preallocated cache behind the tree mask (so no shape depends on a length), the
acceptance schemes are decoder.batched_acceptance's, and the accepted path's KV entries move
in one gather and one scatter over every layer. The host reads one small tensor per step (each
sequence's accepted length and tokens) after it, to stream tokens and stop finished sequences;
a finished sequence stays in the batch and accepts nothing until the slowest is done.

The step is a pure function of its buffers, so a CUDA graph captures it once (after warm-up
steps whose effects are undone) and replays it; torch.compile compiles it once per shape.
Whatever a regime does before its first step (the capture, the compilation, an eager
step's lazy initialisation) is done after the prefill and before decoding is timed, by steps
whose effects are undone, and timed apart as the result's warmup_s: a first step that
captured a graph inside decode_s put some 0.1-0.2 s into the GPU checks' graph steps
(profilers.closed_loop.capture).
The eager reference decoder stays the reference: greedy output is the same token for token,
rejection sampling draws from the same distribution.

Decoding prompts with the step (its warm-up and steps timed) is decoder.static_decode's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from decoder.acceptance import AcceptanceConfig
from decoder.batched_acceptance import VERIFY, StaticTree, Verdict, last_node, sample
from decoder.eagle import CONTEXT, window_mask
from decoder.eagle_batch import DraftPlan, Window, draft_batch
from decoder.fused import FusedForward
from decoder.model import KVCache
from decoder.tree import Drafting, TreeBuffers, tree_attention_mask
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch

WARMUP_STEPS = 2  # eager steps before a capture: lazy initialisation (cuBLAS handles) stays out of the graph


def check_launch(launch: Launch, device: str, dynamic_nodes: int = 0) -> None:
    """One line where a static regime cannot run what was asked: a graph off CUDA, a
    dynamic tree (Medusa's or EAGLE-2's)."""
    if not launch.static:
        return
    if launch is Launch.GRAPH and not str(device).startswith("cuda"):
        raise PerfkitError(f"--launch graph captures a CUDA graph: it needs a CUDA device, not {device!r}")
    if dynamic_nodes > 0:
        raise PerfkitError(
            f"--launch {launch} runs a fixed tree: a dynamic tree ({dynamic_nodes} nodes) changes shape every step; "
            "use --launch eager"
        )


def move_accepted(cache: KVCache, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy cache slots src -> dst (B, W) of every sequence in every layer: one gather and
    one scatter per cache tensor."""
    layers, batch, heads, _, dim = cache.k.shape
    width = src.shape[1]
    take = src[None, :, None, :, None].expand(layers, batch, heads, width, dim)
    put = dst[None, :, None, :, None].expand(layers, batch, heads, width, dim)
    for tensor in (cache.k, cache.v):
        tensor.scatter_(3, put, tensor.gather(3, take))


@dataclass(frozen=True)
class Execution:
    """How a step runs: its launch regime, and whether a static step's forward is decoder.fused's (or the model's)."""

    launch: Launch
    # False: the static step as it ran before decoder.fused, to price data measured so
    fused: bool = True


@dataclass
class StepBuffers:
    """Everything a step reads and writes, allocated once: the graph's inputs and outputs."""

    cache: KVCache
    lengths: torch.Tensor  # (B,) valid cache slots per sequence
    last_hidden: torch.Tensor  # (B, h) hidden state of each sequence's last accepted token
    roots: torch.Tensor  # (B,) each sequence's next root token
    active: torch.Tensor  # (B,) bool: a finished sequence accepts nothing
    forced: torch.Tensor  # (B,) replay: the length to keep this step (0: the scheme's verdict)
    out: torch.Tensor  # (B, 1 + W) the step's accepted length, then its accepted tokens
    # EAGLE's drafting context (decoder.eagle_tree.History as tensors): each sequence's last
    # CONTEXT + 1 accepted (feature, token) pairs, right-aligned, and which slots hold one
    history_features: torch.Tensor | None = None  # (B, CONTEXT + 1, h)
    history_tokens: torch.Tensor | None = None  # (B, CONTEXT + 1)
    history_valid: torch.Tensor | None = None  # (B, CONTEXT + 1)

    def snapshot(self) -> dict[str, torch.Tensor]:
        """The small state a step changes besides cache slots past each sequence's length."""
        names = ("lengths", "last_hidden", "roots", "active", "out")
        names += ("history_features", "history_tokens", "history_valid")
        return {name: getattr(self, name).clone() for name in names if getattr(self, name) is not None}

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        for name, value in saved.items():
            getattr(self, name).copy_(value)


class StaticStep:
    """One decoding step of a fixed tree over a fixed batch (see the module doc)."""

    def __init__(
        self,
        decoder,
        buffers: TreeBuffers,
        batch: int,
        max_len: int,
        acceptance: AcceptanceConfig,
        drafting: Drafting,
        execution: Execution,
        generator: torch.Generator | None,
    ):
        """Of `drafting`, the top-k and the drafter: the tree is the one `buffers` hold."""
        self.model, self.heads = decoder.model, decoder.heads
        self.forward_pass = FusedForward.of(self.model) if execution.fused else self.model
        self.eagle = decoder.eagle if drafting.drafter == DrafterKind.EAGLE else None
        self.tree = StaticTree.of(buffers)
        launch = execution.launch
        self.acceptance, self.topk, self.launch, self.generator = acceptance, drafting.topk, launch, generator
        self.scheme = VERIFY[acceptance.scheme]
        device = buffers.mask.device
        dtype = next(self.model.parameters()).dtype
        config = self.model.config
        size, width = self.tree.size, self.tree.width
        self.max_len = max_len
        self.buffers = StepBuffers(
            cache=KVCache(config, batch, max_len, device, dtype),
            lengths=torch.zeros(batch, dtype=torch.long, device=device),
            last_hidden=torch.zeros(batch, config.hidden_size, dtype=dtype, device=device),
            roots=torch.zeros(batch, dtype=torch.long, device=device),
            active=torch.ones(batch, dtype=torch.bool, device=device),
            forced=torch.zeros(batch, dtype=torch.long, device=device),
            out=torch.zeros(batch, 1 + width, dtype=torch.long, device=device),
        )
        self.offsets = torch.arange(size, device=device)
        self.path_offsets = torch.arange(width, device=device)
        self.rows = torch.arange(batch, device=device)
        self.tree_mask = buffers.mask[None].expand(batch, -1, -1)
        self.depths = buffers.depths
        self.node_head = buffers.node_head.clamp(min=0)
        self.node_rank = buffers.node_rank.clamp(min=0)
        if self.eagle is not None:  # EAGLE drafts the tree: its plan, and the drafting context as tensors
            self.plan = DraftPlan.of(buffers.tree, device)
            slots = CONTEXT + 1
            self.buffers.history_features = torch.zeros(batch, slots, config.hidden_size, dtype=dtype, device=device)
            self.buffers.history_tokens = torch.zeros(batch, slots, dtype=torch.long, device=device)
            self.buffers.history_valid = torch.zeros(batch, slots, dtype=torch.bool, device=device)
            self.window_offsets = torch.arange(CONTEXT, 0, -1, device=device)
            self.window_causal = window_mask(CONTEXT, CONTEXT + 1, device)[0, 0]
        check_launch(launch, str(device))  # a graph step built off CUDA: refused here, not at its capture
        self._run = self._step
        if launch is Launch.COMPILED:
            self._run = torch.compile(self._step, fullgraph=False, dynamic=False)
        self._graph: torch.cuda.CUDAGraph | None = None
        self.warm = False  # whether warm_up has run: a kept step (graph, compiled) is warmed once

    # -- the step -----------------------------------------------------------------------------

    def candidates(self) -> torch.Tensor:
        """(B, T) every sequence's tree: its root, then the heads' top-k at each node."""
        b = self.buffers
        if self.tree.size == 1 or (self.heads is None and self.eagle is None):
            return b.roots[:, None]
        if self.eagle is not None:
            embed, lm_head = self.model.model.embed_tokens, self.model.lm_head
            window = self.window()
            return draft_batch(self.eagle, embed, lm_head, self.plan, b.roots, b.last_hidden, b.lengths, window)
        top = self.heads(b.last_hidden).topk(self.topk, dim=-1).indices.transpose(0, 1)  # (B, K, topk)
        drafted = top[:, self.node_head, self.node_rank]  # (B, T)
        return torch.cat([b.roots[:, None], drafted[:, 1:]], dim=1)

    def window(self) -> Window:
        """Every sequence's EAGLE context window (decoder.eagle_batch.Window) from the history
        buffers: the features of the CONTEXT positions before the root and the tokens after
        them, left-padded where a sequence has fewer."""
        b = self.buffers
        return Window(
            b.history_features[:, :CONTEXT],
            b.history_tokens[:, 1:],
            b.history_valid[:, :CONTEXT],
            b.lengths[:, None] - self.window_offsets,
            self.window_causal,
        )

    def remember(self, features: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor) -> None:
        """Shift each sequence's first `length` (features, tokens) into its history, keeping
        the last CONTEXT + 1: EAGLE's History.push for the batch."""
        b = self.buffers
        slots, width = b.history_tokens.shape[1], tokens.shape[1]
        new = torch.arange(width, device=tokens.device)[None, :] < length[:, None]
        keep = length[:, None] + torch.arange(slots, device=tokens.device)  # the last `slots` of history + new
        joined_t = torch.cat([b.history_tokens, tokens], dim=1).gather(1, keep)
        joined_v = torch.cat([b.history_valid, new], dim=1).gather(1, keep)
        joined_f = torch.cat([b.history_features, features], dim=1)
        joined_f = joined_f.gather(1, keep[:, :, None].expand(-1, -1, joined_f.shape[-1]))
        b.history_tokens.copy_(joined_t)
        b.history_valid.copy_(joined_v)
        b.history_features.copy_(joined_f)

    def forward(self, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states and logits of every tree token, written after each sequence's prefix
        and attending over the whole cache behind the tree mask."""
        b = self.buffers
        slots = b.lengths[:, None] + self.offsets
        mask = tree_attention_mask(b.lengths, self.tree_mask, self.max_len)
        positions = b.lengths[:, None] + self.depths
        hidden = self.forward_pass.hidden(candidates, positions, b.cache, slots, mask, self.max_len)
        return hidden, self.model.lm_head(hidden)

    def verify(self, candidates, logits) -> Verdict:
        """The scheme's verdict, or the replayed length where one is forced."""
        b = self.buffers
        verdict = self.scheme(candidates, logits, self.tree, self.acceptance, self.generator)
        replayed = b.forced > 0
        path = torch.where(replayed[:, None], self.tree.by_length[b.forced], verdict.path)
        length = torch.where(replayed, b.forced, verdict.length) * b.active
        return Verdict(path, length, verdict.next_root)

    def commit(self, candidates, hidden, verdict: Verdict) -> None:
        """Move the accepted path's KV entries after each prefix, advance the lengths, keep
        the last accepted token's hidden state and the next root, and write the step's output."""
        b = self.buffers
        path, length = verdict.path, verdict.length
        if self.tree.width > 1:
            move_accepted(b.cache, b.lengths[:, None] + path, b.lengths[:, None] + self.path_offsets)
        kept = b.active[:, None]
        # out first: a plain step's candidates are a view of the roots about to be replaced
        accepted = candidates.gather(1, path)
        b.out.copy_(torch.cat([length[:, None], accepted], dim=1))
        if self.eagle is not None:
            self.remember(hidden.gather(1, path[:, :, None].expand(-1, -1, hidden.shape[-1])), accepted, length)
        b.last_hidden.copy_(torch.where(kept, hidden[self.rows, last_node(path, length.clamp(min=1))], b.last_hidden))
        b.roots.copy_(torch.where(b.active, verdict.next_root, b.roots))
        b.lengths.add_(length)

    def _step(self) -> None:
        candidates = self.candidates()
        hidden, logits = self.forward(candidates)
        self.commit(candidates, hidden, self.verify(candidates, logits))

    def __call__(self) -> None:
        """Run one step (replaying the captured graph in graph mode); warm_up first."""
        if not self.warm:
            raise PerfkitError("a static step runs after its warm_up(): its capture or compilation is timed apart")
        if self.launch is Launch.GRAPH:
            self._graph.replay()
        else:
            self._run()

    def warm_up(self) -> None:
        """Everything the regime does before its first step, with its effects undone: a
        graph's warm-up steps and capture, a compilation (the first compiled step), or one
        eager step (lazy initialisation, the allocator's first blocks). Once per kept step."""
        if self.launch is Launch.GRAPH:
            self._graph = self._capture()
        else:
            self.undone(1)
        self.warm = True

    def undone(self, steps: int, where: contextlib.AbstractContextManager | None = None) -> None:
        """Run `steps` steps (in `where`, a stream context) and undo what they changed: the
        buffers' small state, the generator's; the cache slots they wrote lie past every
        sequence's length, which the next step writes before it reads. Every regime's
        warm-up runs through here."""
        saved = self.buffers.snapshot()
        rng = self.generator.get_state()
        self.buffers.active.fill_(False)  # warm-up steps accept nothing: no length runs past the cache
        with where or contextlib.nullcontext():
            for _ in range(steps):
                self._run()
        self.buffers.restore(saved)
        self.generator.set_state(rng)

    def _capture(self) -> torch.cuda.CUDAGraph:
        """Capture the step once, after warm-up steps that are undone."""
        self.undone(WARMUP_STEPS, side_stream())
        graph = torch.cuda.CUDAGraph()
        if self.acceptance.samples:
            graph.register_generator_state(self.generator)
        with torch.cuda.graph(graph):
            self._step()
        return graph

    # -- prefill --------------------------------------------------------------------------------

    def start(self, decoder, prompts: list[list[int]]) -> None:
        """Prefill the prompts into the step's cache and set each sequence's first root."""
        b = self.buffers
        lengths, last_hidden, last_logits = decoder._prefill(prompts, b.cache)
        b.lengths.copy_(torch.tensor(lengths))
        b.last_hidden.copy_(last_hidden)
        if self.acceptance.samples:
            roots = sample(torch.softmax(last_logits.float() / self.acceptance.temperature, -1), self.generator)
        else:
            roots = last_logits.argmax(dim=-1)
        b.roots.copy_(roots)
        b.active.fill_(True)
        b.forced.zero_()
        if self.eagle is not None:  # the prompt's last (feature, token), as History.push at prefill
            b.history_valid.zero_()
            b.history_features[:, -1] = last_hidden
            b.history_tokens[:, -1] = torch.tensor([p[-1] for p in prompts])
            b.history_valid[:, -1] = True


@contextlib.contextmanager
def side_stream():
    """Warm-up off the capture stream, as graph capture requires; the current stream waits
    for it after."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)
