"""Medusa decoding (and plain decoding) over a batch of sequences.

One Medusa step for every sequence in the batch:
1. candidates: the heads, run on the hidden state of the last accepted token, give each
   head's top-k; the tree turns them into T candidate tokens (root = the model's own
   next token);
2. forward: one pass over all T tokens at once, written to the KV cache after each
   sequence's own prefix, with position ids prefix + depth and the tree mask;
3. verification: the acceptance scheme picks the longest acceptable path;
4. KV update: the accepted path's cache entries move to the slots right after the
   prefix; the rest is left to be overwritten.
Sequences accept different numbers of tokens, so each keeps its own length.
Plain decoding is the same step with a one-token tree and no heads.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from decoder.acceptance import ACCEPT, AcceptanceConfig, next_token
from decoder.checkpoint import Checkpoint
from decoder.eagle import EAGLE_DEPTH, EAGLE_FILE
from decoder.eagle_batch import DraftPlan, Window, draft_batch
from decoder.eagle_tree import DynamicDraft, History, dynamic_eagle_tree
from decoder.model import KVCache
from decoder.result import STEP_PARTS, DecodeResult, Emission
from decoder.static_decode import static_generate
from decoder.static_step import check_launch
from decoder.tree import Drafting, TreeBuffers, path_of_length, tree_attention_mask, tree_buffers
from perfmodel.acceptance.trees import Tree, greedy_tree
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch

DRAFTERS = ("medusa", "eagle")
ROOT_ONLY = Tree(())
PLAIN = Drafting()  # no tree: one token a step


def check_context(config, prompt_tokens: int, new_tokens: int, option: str = "max_new_tokens") -> None:
    """Refuse a prompt and response longer than the model's context window: past it the
    model was never trained, and the KV cache is allocated for the whole request up front
    (100M new tokens asked 204 GB for the bundled model)."""
    context = config.max_position_embeddings
    if prompt_tokens + new_tokens > context:
        room = context - prompt_tokens
        fits = f"{option} <= {room} fits" if room > 0 else "the prompt alone fills it"
        raise PerfkitError(
            f"a {prompt_tokens}-token prompt and {option} {new_tokens} exceed the model's context of {context} tokens "
            f"(max_position_embeddings); {fits}"
        )


def dynamic_tree(head_probs: torch.Tensor, nodes: int, topk: int) -> Tree:
    """Top-`nodes` paths by joint probability of the heads' top-k predictions (2502.05947).

    head_probs: (K, V). A child's score is never above its parent's, so the best paths
    form a tree: the paper's greedy construction, fed this step's probabilities in place
    of the heads' mean accuracies.
    """
    return greedy_tree(head_probs.topk(topk, dim=-1).values.tolist(), nodes)


def build_candidates(
    roots: list[int], head_logits: torch.Tensor, buffers: list[TreeBuffers], topk: int
) -> torch.Tensor:
    """Candidate tokens (B, T) of every sequence's tree, root first: node i is rank
    node_rank[i] of head node_head[i]'s top-k. head_logits: (K, B, V)."""
    batch, device = len(roots), head_logits.device
    top_tokens = head_logits.topk(topk, dim=-1).indices.transpose(0, 1)  # (B, K, topk)
    heads = torch.stack([b.node_head for b in buffers]).clamp(min=0)
    ranks = torch.stack([b.node_rank for b in buffers]).clamp(min=0)
    candidates = top_tokens[torch.arange(batch, device=device)[:, None], heads, ranks]
    candidates[:, 0] = torch.tensor(roots, device=device)
    return candidates


def commit_path(
    cache: KVCache, lengths: list[int], row: int, path: list[int], hidden, last_hidden, candidates
) -> list[int]:
    """Keep sequence `row`'s accepted tree tokens `path` (indices, root first): move their
    KV entries to the slots right after its prefix (the root's is there already), advance
    its length, keep the last accepted token's hidden state for the heads; returns the
    accepted tokens."""
    index = torch.tensor(path, device=hidden.device)
    start = lengths[row]
    if len(path) > 1:
        cache.move(row, start + index[1:], torch.arange(start + 1, start + len(path), device=hidden.device))
    lengths[row] = start + len(path)
    last_hidden[row] = hidden[row, path[-1]]
    return candidates[row, index].tolist()


class Decoder:
    def __init__(self, checkpoint: Checkpoint, device: str = "cpu"):
        self.ckpt, self.device = checkpoint, device
        self.model = checkpoint.model.to(device)
        self.heads = checkpoint.heads.to(device) if checkpoint.heads is not None else None
        self.eagle = checkpoint.eagle.to(device) if checkpoint.eagle is not None else None
        self._plans: dict = {}  # static tree -> its EAGLE draft plan (decoder.eagle_batch.DraftPlan)
        self._static_steps: dict = {}  # a compiled or captured static step per shape (decoder.static_decode)

    # -- shared machinery --------------------------------------------------------------

    def _sync(self) -> None:
        if self.device != "cpu":
            torch.cuda.synchronize()

    def _prefill(self, prompts: list[list[int]], cache: KVCache):
        """Run the prompts (right-padded) into the cache; hidden and logits at each last token."""
        if any(len(p) == 0 for p in prompts):
            raise PerfkitError("empty prompt: every prompt needs at least one token")
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        tokens = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = torch.tensor(p)
        slots = torch.arange(width, device=self.device).expand(len(prompts), -1)
        j = torch.arange(width, device=self.device)
        ends = torch.tensor(lengths, device=self.device)
        mask = (j[None, :, None] >= j[None, None, :]) & (j[None, None, :] < ends[:, None, None])
        hidden = self.model.hidden(tokens, slots, cache, slots, mask[:, None], width)
        last = hidden[torch.arange(len(prompts)), ends - 1]
        return lengths, last, self.model.lm_head(last)

    def _tree_forward(self, candidates, buffers: list[TreeBuffers], lengths: list[int], cache: KVCache):
        """Hidden states (B, T, h) and logits of every tree token of every sequence."""
        size = candidates.shape[1]
        starts = torch.tensor(lengths, device=self.device)
        depths = torch.stack([b.depths for b in buffers])
        slots = starts[:, None] + torch.arange(size, device=self.device)
        kv_len = max(lengths) + size
        mask = tree_attention_mask(starts, torch.stack([b.mask for b in buffers]), kv_len)
        hidden = self.model.hidden(candidates, starts[:, None] + depths, cache, slots, mask, kv_len)
        return hidden, self.model.lm_head(hidden)

    def _max_len(self, prompts, max_new_tokens: int, tree_size: int) -> int:
        # A finished sequence may sit one tree past its budget while the others go on.
        return max(len(p) for p in prompts) + max_new_tokens + 2 * tree_size + 1

    # -- decoding ------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        drafting: Drafting = PLAIN,
        acceptance: AcceptanceConfig = AcceptanceConfig(),
        eos: int | None = None,
        on_tokens=None,
        replay=None,
        launch: Launch | str = Launch.EAGER,
    ) -> DecodeResult:
        """Decode every prompt, drafting as `drafting` says: no tree is plain decoding, a Tree
        is Medusa with that tree, `dynamic_nodes > 0` is Medusa with a per-step dynamic tree of
        that many nodes; its drafter "medusa" (the heads draft the tree) or "eagle" (the
        checkpoint's EAGLE drafter drafts a static `tree` depth by depth, decoder.eagle_batch).
        `on_tokens(batch_index, tokens)` is called as tokens are accepted (streaming).
        `replay` (decoder.twin.Replay): every step verifies as the scheme does, then keeps
        a path of the length a recorded run accepted there (its `take(batch)` gives each
        sequence's lengths), so a model with dummy weights does a real run's work.
        launch: eager (this loop, sequence by sequence) or a static regime (decoder.static_step:
        the batch's step as tensor ops; static, graph or compiled; Medusa with a fixed tree)."""
        tree, dynamic_nodes, topk, drafter = drafting.tree, drafting.dynamic_nodes, drafting.topk, drafting.drafter
        if max_new_tokens < 1:
            raise PerfkitError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if prompts:
            check_context(self.model.config, max(len(p) for p in prompts), max_new_tokens)
        medusa = tree is not None or dynamic_nodes > 0
        if drafter not in DRAFTERS:
            raise PerfkitError(f"unknown drafter {drafter!r}; choose one of: {', '.join(DRAFTERS)}")
        eagle = drafter == DrafterKind.EAGLE and medusa
        launch = Launch.parse(launch)
        check_launch(launch, self.device, dynamic_nodes)
        if eagle and self.eagle is None:
            raise PerfkitError(
                f"{self.ckpt.folder} has no EAGLE drafter ({EAGLE_FILE}; python -m decoder.train --eagle trains one)"
            )
        if medusa and not eagle and self.heads is None:
            raise PerfkitError(f"{self.ckpt.folder} has no Medusa heads; pass a heads folder or decode without a tree")
        if eagle and tree is not None:
            static = tree_buffers(tree, tree.depth, tree.max_rank + 1, self.device)
        elif eagle:
            static = None  # EAGLE-2's dynamic tree, drafted each step
        elif tree is not None:
            static = tree_buffers(tree, len(self.heads), topk, self.device)
        elif dynamic_nodes > 0:
            static = None  # built each step; its depth and ranks fit by construction
        else:
            static = tree_buffers(ROOT_ONLY, 0, 1, self.device)
        size = dynamic_nodes + 1 if dynamic_nodes > 0 else static.size
        # On CPU whatever the device: decoder.acceptance draws on CPU copies, one random stream on any device.
        generator = torch.Generator().manual_seed(acceptance.seed)
        accept = ACCEPT[acceptance.scheme]
        batch = len(prompts)
        emission = Emission(max_new_tokens, eos, on_tokens)
        replayed = replay.take(batch) if replay is not None else None
        if launch.static:
            # "eagle" only where there is a tree to draft: a plain step keeps no drafting context
            drafted = dataclasses.replace(drafting, drafter="eagle" if eagle else "medusa")
            return static_generate(self, prompts, emission, static, acceptance, drafted, launch, replayed)
        result = DecodeResult.empty(batch)
        cache = KVCache(
            self.model.config,
            batch,
            self._max_len(prompts, max_new_tokens, size),
            self.device,
            next(self.model.parameters()).dtype,
        )
        done = [False] * batch
        dynamic = DynamicDraft(dynamic_nodes, EAGLE_DEPTH, topk)

        with torch.inference_mode():
            started = time.perf_counter()
            lengths, last_hidden, last_logits = self._prefill(prompts, cache)
            roots = [next_token(last_logits[b], acceptance, generator) for b in range(batch)]
            history = History.empty(batch)
            for b, prompt in enumerate(prompts):
                history.push(b, last_hidden[b : b + 1], prompt[-1:])
            self._sync()
            result.prefill_s = time.perf_counter() - started
            started = time.perf_counter()
            while not all(done):
                t0 = time.perf_counter()
                if eagle:
                    buffers, candidates = self.eagle_candidates(roots, last_hidden, static, history, lengths, dynamic)
                else:
                    buffers, candidates = self._candidates(roots, last_hidden, static, dynamic_nodes, topk)
                self._sync()
                t1 = time.perf_counter()
                hidden, logits = self._tree_forward(candidates, buffers, lengths, cache)
                self._sync()
                t2 = time.perf_counter()
                verdicts = [accept(candidates[b], logits[b], buffers[b], acceptance, generator) for b in range(batch)]
                if replayed is not None:  # the scheme's verdict is worked out, then the record's length is kept
                    verdicts = [
                        (path_of_length(buffers[b], replayed[b][len(result.path_lengths[b]) % len(replayed[b])]), root)
                        for b, (_, root) in enumerate(verdicts)
                    ]
                t3 = time.perf_counter()
                for b, (path, next_root) in enumerate(verdicts):
                    if done[b]:
                        continue
                    new = commit_path(cache, lengths, b, path, hidden, last_hidden, candidates)
                    history.push(b, hidden[b, path], new)
                    result.path_lengths[b].append(len(path))
                    roots[b] = next_root
                    done[b] = result.emit(b, new, emission)
                self._sync()
                t4 = time.perf_counter()
                result.tree_sizes.append(size)
                for phase, seconds in zip(STEP_PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    result.times[phase] += seconds
            result.decode_s = time.perf_counter() - started
        result.cache, result.cache_lengths = cache, lengths
        return result

    def eagle_candidates(
        self,
        roots,
        last_hidden,
        static: TreeBuffers | None,
        history: History,
        lengths: list[int],
        dynamic: DynamicDraft,
    ):
        """Per-sequence buffers and candidate tokens (B, T) drafted by the EAGLE drafter: a
        static tree's (decoder.eagle_batch), or EAGLE-2's `dynamic` tree (decoder.eagle_tree).
        What a step's candidates part runs with EAGLE, so the closed loop times it as it runs."""
        embed, lm_head = self.model.model.embed_tokens, self.model.lm_head
        histories = [history.inputs(b) for b in range(len(roots))]
        if static is not None:  # one tree for all: drafted together
            roots_t = torch.tensor(roots, device=self.device)
            positions = torch.tensor(lengths, device=self.device)
            plan = self._plans.get(static.tree)
            if plan is None:  # worked out once per tree, not every step
                plan = self._plans[static.tree] = DraftPlan.of(static.tree, self.device)
            window = Window.of(histories, last_hidden, positions)
            candidates = draft_batch(self.eagle, embed, lm_head, plan, roots_t, last_hidden, positions, window)
            return [static] * len(roots), candidates
        buffers, rows = [], []
        for b in range(len(roots)):
            where = (roots[b], last_hidden[b], histories[b], lengths[b])
            tree, tokens = dynamic_eagle_tree(self.eagle, embed, lm_head, *where, dynamic)
            buffers.append(tree_buffers(tree, tree.depth, dynamic.topk, self.device))
            rows.append(tokens)
        return buffers, torch.stack(rows)

    def _candidates(self, roots, last_hidden, static: TreeBuffers | None, dynamic_nodes: int, topk: int):
        """Per-sequence tree buffers and candidate tokens (B, T), root first."""
        batch = len(roots)
        if self.heads is None or (static is not None and static.size == 1):
            return [static] * batch, torch.tensor(roots, device=self.device)[:, None]
        head_logits = self.heads(last_hidden)  # (K, B, V)
        if static is not None:
            buffers = [static] * batch
        else:
            probs = torch.softmax(head_logits.float(), dim=-1).transpose(0, 1)
            buffers = [
                tree_buffers(dynamic_tree(probs[b], dynamic_nodes, topk), len(self.heads), topk, self.device)
                for b in range(batch)
            ]
        return buffers, build_candidates(roots, head_logits, buffers, topk)
