"""The drafters a speculative step can use, each a step model, an acceptance curve and the
tree sizes it is searched over, so the speedup simulations price them alike
(perfmodel.planning.simulations.speedup_table: speedup = acc(n) x T(1) / T(n)):

- `medusa`: the Medusa heads draft the tree inside the step, in one parallel pass
  (perfmodel.latency.step); acceptance from --acceptance-rates (the paper's preset by default).
- `eagle`: EAGLE drafts depth by depth, one layer and the LM head a pass, then the target
  verifies the tree (perfmodel.latency.eagle); acceptance from an EAGLE record or the EAGLE-2
  preset (perfmodel.acceptance.rates.EAGLE_ACCEPTANCE), capped at depth + 1 tokens (a path
  of the tree and the target's own next token).
- `draft`: a separate draft model (Leviathan et al. 2023): gamma sequential draft steps of c
  x the target's plain step each (c, the cost ratio, as the draft-model comparison takes it),
  then the target verifies the gamma + 1 tokens, a chain, in one step without heads; tokens
  per step (1 - alpha^(gamma+1)) / (1 - alpha). Where verifying gamma + 1 tokens costs one
  plain step (batch 1, memory-bound) this is draft_model_improvement's E / (c gamma + 1); at
  larger batches the verification's own cost counts, as it does for the trees. Given the draft
  model's config.json (a point's --draft-config), its gamma steps are its own plain steps
  instead, priced as the target's are, over the context.

Priced at one point only, from a measured acceptance (perfmodel.planning.drafter_point: no
acceptance curve of theirs is shipped, so the simulations do not search them):

- `eagle3`: EAGLE-3's head (perfmodel.latency.draft_weights), drafting EAGLE's trees or a chain;
- `mtp`: the checkpoint's own MTP module(s) (num_nextn_predict_layers), the same way;
- `ngram`: n-gram lookup in the context (prompt lookup, vLLM's NgramProposer): no device work,
  the host's lookup per sequence (measured, perfmodel.measured.ngram_host) before the target
  verifies the chain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import AcceptanceChoice, AcceptanceModel, draft_model_tokens, drafter_acceptances
from perfmodel.base.drafter_kind import DrafterChoice, DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.draft_weights import EAGLE_WEIGHTS, DraftWeights
from perfmodel.latency.eagle import EAGLE2_SHAPE, DraftShape, eagle_step, without_heads
from perfmodel.latency.step_cost import DraftsThenVerifies, StepCost
from perfmodel.latency.tensor_parallel import TensorParallelStep
from perfmodel.measured.ngram_host import NgramHostCost
from perfmodel.models.config import ModelConfig

# The drafters with an acceptance curve: the simulations, schedules and exports search them;
# the others are priced at one point from a measured acceptance (module doc).
DRAFTERS = (DrafterKind.MEDUSA, DrafterKind.EAGLE, DrafterKind.DRAFT)
DRAFTER_NAMES = {DrafterKind.MEDUSA: "Medusa", DrafterKind.EAGLE: "EAGLE", DrafterKind.DRAFT: "draft model"}
# Every kind's name in words, the simulated three's and those priced from a measured acceptance.
KIND_NAMES = DRAFTER_NAMES | {DrafterKind.EAGLE3: "EAGLE-3", DrafterKind.MTP: "MTP", DrafterKind.NGRAM: "n-gram lookup"}

# Draft-model comparison (speculative decoding with a draft model, Leviathan et al. 2023).
# c = draft step / target step: at batch 1 both steps are weight reads, so c is about the
# parameter ratio plus launch overheads: 68M/7B is 0.01, 1B/7B is 0.14; 0.05 sits between
# them (a draft of about 350M for a 7B target).
DRAFT_ALPHAS = (0.6, 0.7, 0.8, 0.9)
DRAFT_GAMMAS = tuple(range(1, 9))
DEFAULT_DRAFT_COST = 0.05
# The draft model's acceptance rate where one drafter is compared with the others: the middle
# of the comparison's alphas; a pair's own (measured) alpha belongs here.
DEFAULT_DRAFT_ALPHA = 0.7
# Tokens a draft-model step verifies: plain decoding, then gamma drafts and the root.
DRAFT_SIZES = (1, *(g + 1 for g in DRAFT_GAMMAS))


@dataclass(frozen=True)
class DraftModelStep(DraftsThenVerifies):
    """A draft-model step (module doc): the target verifying n = gamma + 1 tokens (`verify`,
    a step without heads) plus gamma draft steps: the draft model's own plain steps (`draft`,
    from its config), else cost_ratio x the target's plain step each."""

    verify: StepCost
    cost_ratio: float
    draft: StepCost | None = None

    @property
    def model(self):
        return self.verify.model

    @property
    def label(self) -> str:
        if self.draft is None:
            return self.verify.label
        return f"{self.verify.label}; draft model {self.draft.model.name}: {self.draft.label}"

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        """The target's prefill, and the draft model's over the same prompt (its own, or
        cost_ratio of the target's)."""
        target = np.asarray(self.verify.prefill_time(batch, prompt_len, False), dtype=float)
        if self.draft is not None:
            return target + np.asarray(self.draft.prefill_time(batch, prompt_len, False), dtype=float)
        return (1 + self.cost_ratio) * target

    def draft_time(self, batch, seq_len, candidates) -> np.ndarray:
        """Seconds of the gamma = candidates - 1 draft steps: the draft model's own plain steps
        over the context (the drafts before each, a few tokens, left out of what it attends to,
        as EAGLE's passes leave them), or each cost_ratio x the target's plain step."""
        gamma = np.asarray(candidates) - 1
        own = self.verify if self.draft is None else self.draft
        plain = np.asarray(own.step_time(batch, seq_len, 1), dtype=float)
        return (self.cost_ratio if self.draft is None else 1.0) * gamma * plain


@dataclass(frozen=True)
class NgramStep(DraftsThenVerifies):
    """An n-gram lookup step (module doc): the host looks up each sequence's chain of
    candidates - 1 drafts in its context (`host`, measured), then the target verifies them."""

    verify: StepCost
    host: NgramHostCost

    @property
    def model(self):
        return self.verify.model

    @property
    def label(self) -> str:
        return f"{self.verify.label}; lookup: {self.host.label}"

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        return self.verify.prefill_time(batch, prompt_len, False)

    def draft_time(self, batch, seq_len, candidates) -> np.ndarray:
        """Seconds of the lookup of a chain of candidates - 1 drafts (none in plain decoding)."""
        lookup = np.vectorize(lambda b, s, n: self.host.seconds(int(b), int(s), int(n) - 1) if n > 1 else 0.0)
        return lookup(batch, seq_len, candidates).astype(float)


@dataclass(frozen=True)
class DraftModelAcceptance:
    """Tokens per step verifying n = gamma + 1 tokens a draft model drafted at rate alpha."""

    alpha: float

    def __call__(self, n) -> np.ndarray:
        return draft_model_tokens(self.alpha, np.asarray(n) - 1)

    def describe(self) -> str:
        return f"(1 - alpha^(gamma+1)) / (1 - alpha), alpha {self.alpha:g}"


@dataclass(frozen=True)
class EagleAcceptance:
    """An EAGLE curve acc(n) held to what a tree of its depth can accept: depth + 1 tokens."""

    curve: AcceptanceModel
    shape: DraftShape

    def __call__(self, n) -> np.ndarray:
        return np.minimum(self.curve(n), self.shape.depths(n) + 1.0)


@dataclass(frozen=True)
class Drafter:
    """One drafter as the simulations price it: its name (a DrafterKind), acceptance n ->
    tokens per step (None for a drafter priced at a point only) and that in words, the sizes
    searched (None: the sweep's), and its settings: the tree's shape (a feature-level
    drafter's), its weights (EAGLE's head where None), the draft model's cost ratio or its own
    steps by flavour (draft_steps, from its config), the n-gram lookup's host cost; choice: the
    acceptance setting it came from (None for the draft model)."""

    name: str
    acceptance: AcceptanceModel | None
    label: str
    sizes: tuple[int, ...] | None = None
    shape: DraftShape | None = None
    cost_ratio: float | None = None
    choice: AcceptanceChoice | None = None
    weights: DraftWeights | None = None
    draft_steps: Mapping[str, StepCost] | None = None
    host: NgramHostCost | None = None
    draft_model: ModelConfig | None = None  # a draft model's own config, where given (its memory)

    def step(self, step: TensorParallelStep) -> StepCost:
        """This drafter's step model over a step flavour (perfmodel.planning.step_models)."""
        return DRAFTER_RULES[DrafterKind(self.name)].step(self, step)

    def depths(self, sizes) -> pd.arrays.IntegerArray:
        """The tree's depth per size (draft passes; gamma for the draft model's chain), NA for
        Medusa's trees, whose depth the tree built decides."""
        n = np.asarray(sizes, dtype=np.int64)
        depths = DRAFTER_RULES[DrafterKind(self.name)].depths(self, n)
        return pd.array([pd.NA] * len(n) if depths is None else depths, dtype="Int64")

    def describe(self) -> str:
        """What it assumes, in one line."""
        return DRAFTER_RULES[DrafterKind(self.name)].describe(self)


@dataclass(frozen=True)
class DrafterRule:
    """How one kind of drafter is priced: its step over a step flavour (the flavour itself
    where the drafter runs inside it), its trees' depths per size (None: the tree's own), and
    what it assumes in words."""

    step: Callable[[Drafter, TensorParallelStep], StepCost]
    depths: Callable[[Drafter, np.ndarray], np.ndarray | None]
    describe: Callable[[Drafter], str]


def draft_model_words(drafter: Drafter) -> str:
    return (
        f"tokens/step {drafter.label}; gamma draft steps of c = {drafter.cost_ratio:g} x the plain step (draft step "
        "/ target step), then the target verifies gamma + 1 tokens"
    )


def draft_model_step(drafter: Drafter, step: TensorParallelStep) -> DraftModelStep:
    """The draft model's step over a step flavour: its own step of that flavour where its
    config was given, else the cost ratio."""
    own = None
    if drafter.draft_steps is not None:
        flavor = str(step.shard_step.flavor)
        if flavor not in drafter.draft_steps:
            raise PerfkitError(
                f"the draft model is not priced in the {flavor} step; have: {', '.join(drafter.draft_steps)}"
            )
        own = drafter.draft_steps[flavor]
    return DraftModelStep(without_heads(step), drafter.cost_ratio, own)


def ngram_step(drafter: Drafter, step: TensorParallelStep) -> NgramStep:
    if drafter.host is None:
        raise PerfkitError("n-gram lookup is priced from its measured host cost: none was given")
    return NgramStep(without_heads(step), drafter.host)


def feature_rule(kind: DrafterKind) -> DrafterRule:
    """A feature-level drafter's rule: EAGLE's step with its weights (EAGLE's head where none)."""
    return DrafterRule(
        lambda d, step: eagle_step(step, d.shape, d.weights or DraftWeights(kind)),
        lambda d, n: d.shape.depths(n),
        lambda d: (
            f"{d.label}, at most depth + 1; {(d.weights or DraftWeights(kind)).describe()}; tree: {d.shape.describe()}"
        ),
    )


# Every drafter kind priced: a new drafter is one entry and its tests.
DRAFTER_RULES: dict[DrafterKind, DrafterRule] = {
    DrafterKind.MEDUSA: DrafterRule(lambda d, step: step, lambda d, n: None, lambda d: d.label),
    DrafterKind.EAGLE: DrafterRule(
        lambda d, step: eagle_step(step, d.shape, d.weights or EAGLE_WEIGHTS),
        lambda d, n: d.shape.depths(n),
        lambda d: f"{d.label}, at most depth + 1; tree: {d.shape.describe()}",
    ),
    DrafterKind.DRAFT: DrafterRule(draft_model_step, lambda d, n: n - 1, draft_model_words),
    DrafterKind.EAGLE3: feature_rule(DrafterKind.EAGLE3),
    DrafterKind.MTP: feature_rule(DrafterKind.MTP),
    DrafterKind.NGRAM: DrafterRule(
        ngram_step, lambda d, n: n - 1, lambda d: f"tokens/step {d.label}; the host's lookup: {d.host.label}"
    ),
}


def medusa_drafter(choice: AcceptanceChoice) -> Drafter:
    return Drafter("medusa", choice.model, choice.label, choice=choice)


def eagle_drafter(choice: AcceptanceChoice, shape: DraftShape = EAGLE2_SHAPE) -> Drafter:
    return Drafter("eagle", EagleAcceptance(choice.model, shape), choice.label, shape=shape, choice=choice)


def draft_model_drafter(alpha: float = DEFAULT_DRAFT_ALPHA, cost_ratio: float = DEFAULT_DRAFT_COST) -> Drafter:
    if not 0 <= alpha <= 1:
        raise PerfkitError(f"the draft model's acceptance rate alpha must be in [0, 1], got {alpha:g}")
    accepts = DraftModelAcceptance(alpha)
    return Drafter("draft", accepts, accepts.describe(), DRAFT_SIZES, cost_ratio=cost_ratio)


def drafters_for(
    which: str, acceptance=None, alpha: float = DEFAULT_DRAFT_ALPHA, cost_ratio: float = DEFAULT_DRAFT_COST
) -> list[Drafter]:
    """The drafters `which` names (one of DRAFTERS, or all), each with its acceptance: the
    setting `acceptance` (a preset, record or model) for the drafter it is of, the preset of
    the others (perfmodel.acceptance.rates.drafter_acceptances)."""
    names = DRAFTERS if which == DrafterChoice.ALL else (which,)
    if which != DrafterChoice.ALL and which not in DRAFTERS:
        raise PerfkitError(f"unknown drafter {which!r}; choose from: {', '.join((*DRAFTERS, 'all'))}")
    curves = [n for n in names if n != DrafterKind.DRAFT]
    if not curves and acceptance is not None:
        raise PerfkitError("the draft model's acceptance is its alpha, not an acceptance curve or record")
    choices = drafter_acceptances(acceptance, curves) if curves else {}
    build = {
        "medusa": lambda: medusa_drafter(choices["medusa"]),
        "eagle": lambda: eagle_drafter(choices["eagle"]),
        "draft": lambda: draft_model_drafter(alpha, cost_ratio),
    }
    return [build[n]() for n in names]
