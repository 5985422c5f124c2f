"""One point's answer for a drafter outside the step: EAGLE's or EAGLE-3's head, an MTP
module, a draft model or n-gram lookup, drafting a tree or a chain, then the target verifying it.

Practitioners who measured their drafter's acceptance (tokens per step) ask what its step
costs against a plain step and what speedup that buys. The step is priced in two parts,
drafting (a feature-level drafter's sequential passes of one layer and an LM head, gamma steps
of the draft model, or the host's n-gram lookup) and verification (the target over the drafted
tokens and the root, without heads), each by the drafter's step model over the flavour asked
(perfmodel.planning.drafters):

    overhead = (drafting + verification) / plain step,  speedup = acceleration / overhead,

and the time per token is the step over the acceleration. A shape is the drafter's default
tree of n tokens (EAGLE-2's top-k expansion; a draft model's chain of n - 1 drafts) or a chain
of K drafts (K + 1 tokens verified, one path: vLLM's default). A drafter proposing one path
only (a draft model, n-gram lookup) drafts a chain of n - 1 for a size of n.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.base.drafter_kind import CHAIN_DRAFTERS, FEATURE_DRAFTERS, DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.draft_weights import DraftWeights
from perfmodel.latency.eagle import EAGLE2_SHAPE, DraftShape, StaticTreeDraft
from perfmodel.latency.step import FULL_STEP_LEAVES_OUT, StepFlavor
from perfmodel.latency.step_cost import StepCost
from perfmodel.latency.tensor_parallel import TensorParallelStep
from perfmodel.measured.ngram_host import NgramHostCost
from perfmodel.models.config import ModelConfig
from perfmodel.planning.drafters import DEFAULT_DRAFT_COST, Drafter, drafters_for
from perfmodel.planning.engine_tree import engine_tree

DRAFTER_POINT_COLUMNS = (
    "device",
    "model",
    "dtype",
    "step",
    "drafter",
    "shape",
    "batch",
    "context",
    "tokens_verified",
    "draft_passes",
    "acceleration",
    "plain_step_ms",
    "draft_ms",
    "verify_ms",
    "step_ms",
    "overhead",
    "speedup",
    "ms_per_token",
    "latency_model",
    "source",
)


@dataclass(frozen=True)
class DraftedShape:
    """What one speculative step drafts: `tokens` verified (root included), as the drafter's
    default tree of that size or, with `chain`, one path of tokens - 1 drafts."""

    tokens: int
    chain: bool = False
    tree: DraftShape | None = None  # an engine's own tree (perfmodel.planning.engine_tree)

    @classmethod
    def of(cls, tree_size: int | None, chain: int | None) -> DraftedShape:
        """From --tree-size (tokens, root included) or --chain (drafts): exactly one of them."""
        if (tree_size is None) == (chain is None):
            raise PerfkitError("give the shape as one of --tree-size T (tokens, root included) or --chain K (drafts)")
        if chain is not None:
            if not isinstance(chain, int) or chain < 1:
                raise PerfkitError(f"--chain {chain}: a chain has at least one draft (K >= 1)")
            return cls(chain + 1, chain=True)
        if tree_size < 2:
            raise PerfkitError(
                f"--tree-size {tree_size}: a speculative step verifies the root and at least one candidate (>= 2)"
            )
        return cls(tree_size)

    @classmethod
    def of_engine(cls, values) -> DraftedShape:
        """From an engine's tree parameters (--engine-tree KEY=VALUE ...)."""
        tokens, tree = engine_tree(values)
        return cls(tokens, tree=tree)

    def describe(self, drafter: Drafter) -> str:
        if self.tree is not None:
            return f"an engine's {self.tokens}-token tree ({self.tree.depth} steps of top-{self.tree.top_k})"
        if self.chain or drafter.name in CHAIN_DRAFTERS:
            return f"a chain of {self.tokens - 1} draft(s)"
        tree = drafter.shape
        if isinstance(tree, StaticTreeDraft):
            return f"a static {self.tokens}-token tree ({int(tree.depths(self.tokens))} passes)"
        return f"a {self.tokens}-token tree (EAGLE-2's top-{tree.top_k} expansion, at most {tree.depth} passes)"

    def drafter(self, drafter: Drafter) -> Drafter:
        """The drafter drafting this shape: a feature-level drafter's chain is one node
        expanded per pass."""
        if self.tree is not None:
            if drafter.name not in FEATURE_DRAFTERS:
                raise PerfkitError(
                    f"--engine-tree shapes a feature-level drafter's tree ({', '.join(FEATURE_DRAFTERS)}), not "
                    f"{drafter.name}'s"
                )
            return dataclasses.replace(drafter, shape=self.tree)
        if self.chain and drafter.name in FEATURE_DRAFTERS:
            return dataclasses.replace(drafter, shape=DraftShape(depth=self.tokens - 1, top_k=1))
        return drafter


def point_drafter(
    kind: DrafterKind,
    target: ModelConfig,
    own: ModelConfig | None = None,
    cost_ratio: float = DEFAULT_DRAFT_COST,
    host: NgramHostCost | None = None,
) -> Drafter:
    """The drafter `kind` priced at one point for `target`, from a measured acceptance: `own`
    the drafter's shapes from its config (perfmodel.models.drafter_config: a head's, or a
    draft model's, whose steps the caller adds as draft_steps); a draft model without one is
    priced at `cost_ratio` of the target's step; n-gram lookup at its measured `host` cost."""
    if kind == DrafterKind.MEDUSA:
        raise PerfkitError("the Medusa heads draft inside the step: its point is a step of the tree's size")
    if kind == DrafterKind.MTP and not target.mtp_layers:
        raise PerfkitError(
            f"--drafter mtp: {target.name} declares no MTP module (num_nextn_predict_layers in its config.json); give "
            "the config.json of a checkpoint that carries one"
        )
    if kind == DrafterKind.NGRAM and host is None:
        raise PerfkitError("--drafter ngram: n-gram lookup is priced from its measured host cost; none was given")
    label = "measured at the point"
    if kind == DrafterKind.EAGLE and own is None:
        (eagle,) = drafters_for(DrafterKind.EAGLE)
        return eagle
    if kind in FEATURE_DRAFTERS:
        return Drafter(kind, None, label, shape=EAGLE2_SHAPE, weights=DraftWeights(kind, own))
    if kind == DrafterKind.DRAFT:
        words = "its own steps" if own is not None else f"c = {cost_ratio:g} x the target's step"
        return Drafter(kind, None, f"{label}; draft model: {words}", cost_ratio=cost_ratio, draft_model=own)
    return Drafter(kind, None, label, host=host)


def drafter_words(drafter: Drafter) -> str:
    """Who drafts, in a few words, for a point's heading: the weights or model that draft, or
    the host's lookup; empty for EAGLE's head and a draft model at its cost ratio, which the
    drafter's name says."""
    if drafter.weights is not None:
        return drafter.weights.describe()
    if drafter.draft_steps:
        model = next(iter(drafter.draft_steps.values())).model
        return f"the draft model {model.name}: {model.num_layers} layers, hidden {model.hidden_size}"
    if drafter.host is not None:
        return f"the host's lookup, {drafter.host.label}"
    return ""


def with_draft_steps(drafter: Drafter, steps: dict[str, StepCost]) -> Drafter:
    """The draft model `drafter` drafting with its own steps, by flavour."""
    return dataclasses.replace(drafter, draft_steps=dict(steps))


def tokens_per_step(rates) -> float:
    """Tokens a step yields from per-position acceptance rates of a chain (as vLLM's /metrics
    counts them: of the drafts, the share whose position j was accepted, every earlier one
    accepted too): 1 + the sum of the rates. Rates must lie in [0, 1] and not rise with the
    position, since a draft is accepted only after every draft before it."""
    rates = [float(r) for r in rates]
    if not rates:
        raise PerfkitError("--position-rates: give one rate per draft position, the first position's first")
    bad = [r for r in rates if not (math.isfinite(r) and 0 <= r <= 1)]
    if bad:
        raise PerfkitError(f"--position-rates {bad[0]:g}: a position's acceptance rate lies in [0, 1]")
    rising = next((j for j in range(1, len(rates)) if rates[j] > rates[j - 1]), None)
    if rising is not None:
        raise PerfkitError(
            f"--position-rates: position {rising + 1}'s {rates[rising]:g} exceeds position {rising}'s "
            f"{rates[rising - 1]:g}; a draft is accepted only after every draft before it, so rates do not rise"
        )
    return 1.0 + sum(rates)


def most_accepted(drafter: Drafter, tokens: int) -> int:
    """The most tokens a step of `tokens` verified can yield: its deepest path accepted whole,
    and the target's own token."""
    passes = drafter.depths([tokens])[0]
    return tokens if passes is pd.NA else int(passes) + 1


def drafter_point(
    steps: dict[str, TensorParallelStep],
    drafter: Drafter,
    shape: DraftedShape,
    batch: int,
    context: int,
    acceleration: float,
) -> pd.DataFrame:
    """Rows (without the device columns) of each flavour's step in `steps` drafted by `drafter`."""
    drafter = shape.drafter(drafter)
    most = most_accepted(drafter, shape.tokens)
    if not (math.isfinite(acceleration) and 1 <= acceleration <= most):
        raise PerfkitError(
            f"--acceleration {acceleration:g}: {shape.describe(drafter)} verified by {drafter.name} yields 1 to {most} "
            f"tokens a step (its deepest path of {most - 1} draft(s), each accepted, and the target's own token)"
        )
    rows = []
    for flavor, step in steps.items():
        spec = drafter.step(step)
        plain, total, draft = (
            float(np.asarray(t).ravel()[0])
            for t in (
                spec.step_time(batch, context, 1),
                spec.step_time(batch, context, shape.tokens),
                spec.draft_time(batch, context, shape.tokens),
            )
        )
        passes = drafter.depths([shape.tokens])[0]
        rows.append(
            {
                "step": flavor,
                "drafter": drafter.name,
                "shape": shape.describe(drafter),
                "batch": batch,
                "context": context,
                "tokens_verified": shape.tokens,
                "draft_passes": shape.tokens - 1 if passes is pd.NA else int(passes),
                "acceleration": acceleration,
                "plain_step_ms": plain * 1e3,
                "draft_ms": draft * 1e3,
                "verify_ms": (total - draft) * 1e3,
                "step_ms": total * 1e3,
                "overhead": total / plain,
                "speedup": acceleration * plain / total,
                "ms_per_token": total / acceleration * 1e3,
                "latency_model": spec.label,
                "source": "predicted",
            }
        )
    return pd.DataFrame(rows)


def passes_words(drafter: str, passes: int) -> str:
    """What a step's drafting ran: the host's lookup (n-gram), else its passes or draft steps."""
    if drafter == DrafterKind.NGRAM:
        return f"the host's lookup of {passes} token(s)"
    return f"{passes} pass(es)"


def drafter_point_lines(rows: pd.DataFrame) -> list[str]:
    """What a person reads: per flavour the plain step, drafting and verification apart, the
    overhead, the speedup and the time per token; first, where a full step is priced, what it
    leaves out."""
    unpriced = [FULL_STEP_LEAVES_OUT] if (rows["step"] == StepFlavor.FULL).any() else []
    return unpriced + [
        f"  {r.step}: plain step {r.plain_step_ms:.3f} ms; {r.drafter} step {r.step_ms:.3f} ms = drafting "
        f"{r.draft_ms:.3f} ms ({passes_words(r.drafter, r.draft_passes)}) + verification {r.verify_ms:.3f} ms "
        f"({r.tokens_verified} "
        f"tokens): overhead {r.overhead:.3f}, speedup {r.speedup:.2f}x at acceleration {r.acceleration:g}, "
        f"{r.ms_per_token:.3f} ms per token"
        for r in rows.itertuples()
    ]
