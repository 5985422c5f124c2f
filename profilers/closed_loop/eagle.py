"""The closed loop with EAGLE drafting (python -m perfmodel.validate --drafter eagle): what
differs from the Medusa heads' loop.

- Acceptance by replay, as for the heads: along each prompt's plain continuation the drafter
  drafts the chain of the tokens that came (decoder.eagle.chain_hits: every depth from its
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
- The drafting's host overhead (its Python, the module calls, the masks, gathers and
  concatenations between the timed ops) grows with the passes and with the tokens each runs
  (measured: 0.4-0.6 ms a pass at 5-30 tokens, 0.7-1.1 ms at 60). It is fitted, per pass and
  per token drafted, on three drafts timed on their own (PROBE_TREES: breadth-first trees of
  1, 2 and 4 passes, none a tree the run validates) minus their priced ops: never on an
  EAGLE decoding run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import nnls

from decoder.eagle import CONTEXT, EAGLE_DEPTH, History, chain_hits
from decoder.runs import decode_batches
from decoder.tree import tree_buffers
from perfmodel.acceptance.batching import conditional_accuracy
from perfmodel.acceptance.trees import Tree, greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.eagle import EagleStep, StaticTreeDraft
from perfmodel.models.operators import HEAD_TOP_K
from profilers.closed_loop.config import STEP_FLAVOR, ValidateConfig
from profilers.closed_loop.untimed import UntimedPasses, decode_kwargs, prompt_generations, prompt_survivals

# Drafts timed on their own for the drafting's host overhead: 1, 2 and 4 passes over 5, 14
# and 74 tokens per sequence (breadth-first, so unlike the greedy trees a run validates).
PROBE_TREES = (Tree.breadth_first(4, 4), Tree.breadth_first(12, 4), Tree.breadth_first(50, 3))


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
    trees = {("static", n): {"tree": greedy_tree(accuracy, n - 1), "drafter": "eagle"} for n in config.sizes}
    record = UntimedPasses(accuracy, per_prompt, hits, [], None, {("plain", 1): {}} | trees)
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
    return tuple(setting["tree"] for (kind, _), setting in record.settings.items() if kind == "static")


def draft_shapes(record: UntimedPasses) -> tuple[StaticTreeDraft, StaticTreeDraft]:
    """What the run's trees and the probes draft, as this decoder drafts them."""
    return StaticTreeDraft(run_trees(record), CONTEXT), StaticTreeDraft(PROBE_TREES, CONTEXT)


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
    calls = []
    for tree in PROBE_TREES:
        buffers = tree_buffers(tree, tree.depth, tree.max_rank + 1, decoder.device)

        def draft(buffers=buffers):
            with torch.inference_mode():
                decoder.eagle_candidates(roots, last, buffers, history, lengths, 0, HEAD_TOP_K)

        calls.append(draft)
    return calls


def draft_work(shape: StaticTreeDraft, sizes) -> np.ndarray:
    """(passes, tokens run) per sequence of drafting each tree size (0, 0 for plain decoding)."""
    out = []
    for n in np.atleast_1d(sizes):
        passes = shape.tree(int(n)).draft_passes if n > 1 else ()
        out.append((len(passes), sum(shape.window + run for run, _ in passes)))
    return np.array(out, dtype=float).reshape(-1, 2)


@dataclass(frozen=True)
class DraftHost:
    """The drafting's host overhead: `per_pass` seconds a pass and `per_token` a token it runs
    per sequence, fitted on the probes (measured minus priced ops; non-negative least squares,
    `residuals` after the fit)."""

    per_pass: float
    per_token: float
    residuals: tuple[float, ...]

    @classmethod
    def fit(cls, step: EagleStep, probes: StaticTreeDraft, batch: int, context: int, measured) -> DraftHost:
        sizes = np.array([t.size for t in probes.trees])
        priced = EagleStep(step.verify, step.model, step.latency, STEP_FLAVOR, probes).draft_time(batch, context, sizes)
        host = np.asarray(measured, dtype=float) - priced
        work = draft_work(probes, sizes)
        # non-negative: a few noisy probes must not fit a negative cost that larger trees extrapolate
        (per_pass, per_token), _ = nnls(work, host)
        return cls(float(per_pass), float(per_token), tuple(float(r) for r in work @ [per_pass, per_token] - host))

    def seconds(self, shape: StaticTreeDraft, sizes) -> np.ndarray:
        return draft_work(shape, sizes) @ np.array([self.per_pass, self.per_token])

    def describe(self) -> str:
        worst = max(abs(r) for r in self.residuals) * 1e3
        return (
            f"drafting's host overhead {self.per_pass * 1e3:.3f} ms per pass + {self.per_token * 1e6:.1f} us per token "
            f"drafted per sequence (fitted on {len(self.residuals)} drafts timed alone, within {worst:.3f} ms)"
        )
