"""The closed loop with EAGLE drafting (python -m perfmodel.validate --drafter eagle): what
differs from the Medusa heads' loop.

- Acceptance by replay, as for the heads: along each prompt's plain continuation the drafter
  drafts the chain of the tokens that came (decoder.eagle_batch.chain_hits: every depth from its
  parent's drafted feature, with the context window the decoder has there), which gives at
  every position the rank of each coming token at each depth. Greedy verification accepts a
  static tree's path exactly where those ranks lie along it, so every tree's steps replay
  through them (the decoder's step counts exactly). The trees are the drafter's own: the
  greedy tree of each size on its conditional accuracies (a_k^(i) where every shallower
  depth's token came within the top-k).
- The step priced: the tree verification (the reference step without heads) at the context
  its attention spans, plus the host overhead calibrated on plain decoding (as for the
  heads), plus the drafting (perfmodel.latency.eagle: StaticTreeDraft, the passes this
  decoder runs, each op timed beside the runs), plus the drafting's own host overhead.
- The drafting's host overhead: its Python (each sequence's window gathered, the plan, the
  masks, gathers and concatenations between the timed ops, the module calls), less what the
  ops timed alone in a random order cost beyond what they cost in a pass. It is fitted, per
  draft and per pass, on four drafts timed on their own (PROBE_TREES: breadth-first trees of
  1, 2 and 4 passes and a chain of 5, none a tree the run validates) minus their priced ops:
  never on an EAGLE decoding run. Measured on the 2-core EPYC: about 0.4-0.8 ms a draft, and
  per pass from -0.02 ms (batch 1) to -0.19 ms (batch 4), the cold-cache surplus of the ops
  timed alone outgrowing the Python of a pass; a per-token term fitted nothing there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from decoder.eagle import CONTEXT, EAGLE_DEPTH
from decoder.eagle_batch import chain_hits
from decoder.eagle_tree import DynamicDraft, History
from decoder.runs import decode_batches
from decoder.tree import Drafting, tree_buffers
from perfmodel.acceptance.batching import conditional_accuracy
from perfmodel.acceptance.trees import Tree, greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.eagle import EagleStep, StaticTreeDraft, draft_points
from perfmodel.models.operators import HEAD_TOP_K
from profilers.closed_loop.config import STEP_FLAVOR, ValidateConfig
from profilers.closed_loop.tree_kind import TreeKind
from profilers.closed_loop.untimed import UntimedPasses, decode_kwargs, prompt_generations, prompt_survivals

# Drafts timed on their own for the drafting's host overhead: 1, 2, 4 and 5 passes (the
# drafter is trained 5 deep) over 5, 14, 74 and 35 tokens per sequence; breadth-first trees
# and a chain, unlike the greedy trees a run validates.
PROBE_TREES = (
    Tree.breadth_first(4, 4),
    Tree.breadth_first(12, 4),
    Tree.breadth_first(50, 3),
    Tree.breadth_first(5, 1),
)


def eagle_untimed_passes(decoder, prompts, config: ValidateConfig, log) -> UntimedPasses:
    """Plain decoding, then the drafter's chain along every prompt's continuation: its hits
    (replayed for each tree's acceptance) and its conditional accuracies (which choose the
    trees)."""
    if decoder.eagle is None:
        raise PerfkitError(
            f"{decoder.ckpt.folder} has no EAGLE drafter to validate (python -m decoder.train --eagle trains one)"
        )
    log(f"plain decoding of {len(prompts)} held-out prompts, then the EAGLE drafter along each ...")
    outputs = decode_batches(decoder, prompts, config.batch, config.new_tokens, **decode_kwargs(config)).tokens
    hits = [prompt_hits(decoder, p, o) for p, o in zip(prompts, outputs)]
    accuracy = conditional_accuracy(np.concatenate(hits))
    per_prompt = [conditional_accuracy(h) for h in hits]
    trees = {
        (TreeKind.STATIC, n): {"drafting": Drafting(greedy_tree(accuracy, n - 1), drafter="eagle")}
        for n in config.sizes
    }
    record = UntimedPasses(accuracy, per_prompt, hits, [], None, {(TreeKind.PLAIN, 1): {}} | trees)
    record.survivals = {key: prompt_survivals(*key, record) for key in trees}
    record.generations = {key: prompt_generations(*key, record, config) for key in trees}
    return record


def prompt_hits(decoder, prompt, output) -> np.ndarray:
    """(positions, depth, topk) hits of the drafter's chain along one decoded prompt."""
    row = torch.tensor(prompt + output, device=decoder.device)
    embed, lm_head = decoder.model.model.embed_tokens, decoder.model.lm_head
    with torch.inference_mode():
        features = decoder.model.hidden(row[None])[0]
        hits = chain_hits(decoder.eagle, embed, lm_head, features, row, len(prompt) - 1, EAGLE_DEPTH, HEAD_TOP_K)
    return hits.cpu().numpy()


def run_trees(record: UntimedPasses) -> tuple[Tree, ...]:
    return tuple(setting["drafting"].tree for (kind, _), setting in record.settings.items() if kind == TreeKind.STATIC)


def draft_shapes(record: UntimedPasses) -> tuple[StaticTreeDraft, StaticTreeDraft]:
    """What the run's trees and the probes draft, as this decoder drafts them."""
    return StaticTreeDraft(run_trees(record), CONTEXT), StaticTreeDraft(PROBE_TREES, CONTEXT)


def drafting_to_time(model, config: ValidateConfig, record: UntimedPasses, decoder, prompt) -> tuple[list, list]:
    """What the operator rounds time besides the step: the op points of every draft (the run's
    trees and the probes) and the probe drafts themselves, on the features of `prompt`."""
    points = []
    for shape in draft_shapes(record):
        sizes = [t.size for t in shape.trees]
        points += draft_points(model, STEP_FLAVOR, shape, config.batch, config.context, sizes)
    with torch.inference_mode():
        features = decoder.model.hidden(torch.tensor([prompt], device=decoder.device))[0]
    return points, draft_probes(decoder, config.batch, features, config.seed)


def draft_probes(decoder, batch: int, features: torch.Tensor, seed: int) -> list:
    """One call per PROBE_TREES drafting that tree for a batch, as a step's candidates part
    does (Decoder.eagle_candidates), from a full context window of real features."""
    rng = torch.Generator().manual_seed(seed)
    vocab = decoder.model.config.vocab_size
    history = History.empty(batch)
    for b in range(batch):
        history.push(b, features[: CONTEXT + 1], torch.randint(0, vocab, (CONTEXT + 1,), generator=rng).tolist())
    roots = torch.randint(0, vocab, (batch,), generator=rng).tolist()
    last = features[CONTEXT][None].repeat(batch, 1)
    lengths = [len(features)] * batch
    static_only = DynamicDraft(0, EAGLE_DEPTH, HEAD_TOP_K)
    calls = []
    for tree in PROBE_TREES:
        buffers = tree_buffers(tree, tree.depth, tree.max_rank + 1, decoder.device)

        def draft(buffers=buffers):
            with torch.inference_mode():
                decoder.eagle_candidates(roots, last, buffers, history, lengths, static_only)

        calls.append(draft)
    return calls


def draft_work(shape: StaticTreeDraft, sizes) -> np.ndarray:
    """(drafts, passes) per sequence and step of each tree size: (1, depth), (0, 0) for plain
    decoding, which drafts nothing."""
    out = []
    for n in np.atleast_1d(sizes):
        depth = shape.tree(int(n)).depth if n > 1 else 0
        out.append((float(depth > 0), depth))
    return np.array(out, dtype=float).reshape(-1, 2)


@dataclass(frozen=True)
class DraftHost:
    """The drafting's host overhead: `per_draft` seconds a step's draft and `per_pass` a pass
    (module doc), fitted by least squares on the probes (measured minus priced ops;
    `residuals` after the fit)."""

    per_draft: float
    per_pass: float
    residuals: tuple[float, ...]

    @classmethod
    def fit(cls, step: EagleStep, probes: StaticTreeDraft, batch: int, context: int, measured) -> DraftHost:
        sizes = np.array([t.size for t in probes.trees])
        priced = dataclasses.replace(step, shape=probes).draft_time(batch, context, sizes)
        host = np.asarray(measured, dtype=float) - priced
        work = draft_work(probes, sizes)
        (per_draft, per_pass), *_ = np.linalg.lstsq(work, host, rcond=None)
        return cls(float(per_draft), float(per_pass), tuple(float(r) for r in work @ [per_draft, per_pass] - host))

    def seconds(self, shape: StaticTreeDraft, sizes) -> np.ndarray:
        return draft_work(shape, sizes) @ np.array([self.per_draft, self.per_pass])

    def describe(self) -> str:
        worst = max(abs(r) for r in self.residuals) * 1e3
        return (
            f"drafting's host overhead {self.per_draft * 1e3:.3f} ms per draft {self.per_pass * 1e3:+.3f} ms per pass "
            f"(fitted on {len(self.residuals)} drafts timed alone, within {worst:.3f} ms)"
        )
