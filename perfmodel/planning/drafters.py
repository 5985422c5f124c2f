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
  larger batches the verification's own cost counts, as it does for the trees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import AcceptanceChoice, AcceptanceModel, draft_model_tokens, drafter_acceptances
from perfmodel.base.drafter_kind import DrafterChoice, DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.eagle import EAGLE2_SHAPE, DraftShape, eagle_step, without_heads
from perfmodel.latency.step_cost import DraftsThenVerifies, StepCost
from perfmodel.latency.tensor_parallel import TensorParallelStep

DRAFTERS = tuple(DrafterKind)
DRAFTER_NAMES = {DrafterKind.MEDUSA: "Medusa", DrafterKind.EAGLE: "EAGLE", DrafterKind.DRAFT: "draft model"}

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
    a step without heads) plus gamma draft steps of cost_ratio x its plain step."""

    verify: StepCost
    cost_ratio: float

    @property
    def model(self):
        return self.verify.model

    def prefill_time(self, batch, prompt_len, medusa: bool = False) -> np.ndarray:
        """The target's prefill, and the draft model's over the same prompt at cost_ratio of it."""
        return (1 + self.cost_ratio) * np.asarray(self.verify.prefill_time(batch, prompt_len, False), dtype=float)

    def draft_time(self, batch, seq_len, candidates) -> np.ndarray:
        """Seconds of the gamma = candidates - 1 draft steps, each cost_ratio x the plain step."""
        plain = np.asarray(self.verify.step_time(batch, seq_len, 1), dtype=float)
        return self.cost_ratio * (np.asarray(candidates) - 1) * plain

    def step_time(self, batch, seq_len, candidates=1) -> np.ndarray:
        verify = np.asarray(self.verify.step_time(batch, seq_len, candidates), dtype=float)
        return verify + self.draft_time(batch, seq_len, candidates)


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
    """One drafter as the simulations price it: its name (DRAFTERS), acceptance n -> tokens
    per step and that in words, the sizes searched (None: the sweep's), and its settings:
    the EAGLE tree's shape, the draft model's cost ratio; choice: the acceptance setting it
    came from (None for the draft model)."""

    name: str
    acceptance: AcceptanceModel
    label: str
    sizes: tuple[int, ...] | None = None
    shape: DraftShape | None = None
    cost_ratio: float | None = None
    choice: AcceptanceChoice | None = None

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


# Every drafter kind the simulations price: a new drafter is one entry and its tests.
DRAFTER_RULES: dict[DrafterKind, DrafterRule] = {
    DrafterKind.MEDUSA: DrafterRule(lambda d, step: step, lambda d, n: None, lambda d: d.label),
    DrafterKind.EAGLE: DrafterRule(
        lambda d, step: eagle_step(step, d.shape),
        lambda d, n: d.shape.depths(n),
        lambda d: f"{d.label}, at most depth + 1; tree: {d.shape.describe()}",
    ),
    DrafterKind.DRAFT: DrafterRule(
        lambda d, step: DraftModelStep(without_heads(step), d.cost_ratio), lambda d, n: n - 1, draft_model_words
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
