"""A drafter searched over the chains its measured per-position acceptance covers: the
acceptance curve of a chain of K drafts is 1 + r_1 + ... + r_K tokens per step
(perfmodel.planning.drafter_point.tokens_per_step), so a team's measured rates (vLLM's
/metrics) give every chain up to their length, and a schedule or a capacity plan searches
them as it searches a simulated drafter's trees (perfmodel.planning.drafters.Drafter: an
acceptance n -> tokens per step over its sizes). A chain longer than the rates is not searched:
its acceptance was not measured, and is not guessed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfmodel.base.drafter_kind import FEATURE_DRAFTERS, DrafterKind
from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.draft_weights import DraftWeights
from perfmodel.latency.eagle import DraftShape
from perfmodel.measured.ngram_host import ngram_host_cost
from perfmodel.models.config import ModelConfig
from perfmodel.models.drafter_config import drafter_model
from perfmodel.models.moe import layer_slice
from perfmodel.planning.deployment import Deployment, DeploymentChoices, resolve
from perfmodel.planning.drafter_point import point_drafter, tokens_per_step, with_draft_steps
from perfmodel.planning.drafters import DEFAULT_DRAFT_COST, KIND_NAMES, Drafter
from perfmodel.planning.medusa_setting import check_setting
from perfmodel.planning.memory import DrafterMemory, feature_head_bytes, replica_kv_bytes_per_token, weight_params


@dataclass(frozen=True)
class ChainAcceptance:
    """Tokens per step of a chain verifying n tokens (n - 1 drafts) at measured per-position
    rates: 1 + the first n - 1 rates; defined for n = 1 .. len(rates) + 1."""

    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        tokens_per_step(self.rates)  # the rates checked, in one line

    def __call__(self, n) -> np.ndarray:
        n = np.asarray(n, dtype=np.int64)
        if (n < 1).any() or (n > len(self.rates) + 1).any():
            raise PerfkitError(
                f"a chain of {int(n.max()) - 1} drafts: the measured rates cover chains of 0 to {len(self.rates)}"
            )
        tokens = np.concatenate([[1.0], 1.0 + np.cumsum(self.rates)])
        return tokens[n - 1]

    def describe(self) -> str:
        rates = " ".join(f"{r:g}" for r in self.rates)
        return f"measured per-position acceptance {rates}: a chain of K drafts yields 1 + r_1 + ... + r_K tokens/step"


def measured_chain_drafter(drafter: Drafter, rates) -> Drafter:
    """`drafter` searched over the chains of 1 .. len(rates) drafts, its acceptance the rates'
    (a feature-level drafter drafts one node a pass: its shape a chain as deep as the rates)."""
    if drafter.name == DrafterKind.MEDUSA:
        raise PerfkitError(
            "--position-rates prices a drafter outside the step's chain (eagle, eagle3, mtp, draft, ngram); the "
            "Medusa heads' trees take --acceptance-rates"
        )
    accepts = ChainAcceptance(tuple(float(r) for r in rates))
    chained = {}
    if drafter.name in FEATURE_DRAFTERS:
        chained["shape"] = DraftShape(depth=len(accepts.rates), top_k=1)
    return dataclasses.replace(
        drafter, acceptance=accepts, label=accepts.describe(), sizes=tuple(range(1, len(accepts.rates) + 2)), **chained
    )


def measured_drafter(
    kind: DrafterKind,
    rates,
    deployment: Deployment,
    draft_config: str | Path | None = None,
    cost_ratio: float = DEFAULT_DRAFT_COST,
) -> Drafter:
    """The drafter `kind` of `deployment`'s model, searched over the chains its measured `rates`
    cover: from its own config.json where given (perfmodel.models.drafter_config: a head's shapes,
    or a draft model's, whose steps are then its own, priced as the target's are on the same
    device, degree and latency source); n-gram lookup at this host's measured cost."""
    target = deployment.model
    own = None if draft_config is None else drafter_model(draft_config, kind, target)
    host = ngram_host_cost() if kind == DrafterKind.NGRAM else None
    drafter = point_drafter(kind, target, own, cost_ratio, host)
    if kind == DrafterKind.DRAFT and own is not None:
        choices = DeploymentChoices(
            deployment.dtype, deployment.tp, deployment.latency, deployment.step, deployment.tracer, deployment.launch
        )
        (drafting,) = resolve(own, [deployment.view], choices)
        drafter = with_draft_steps(drafter, {str(deployment.step): drafting.step_model()})
    return measured_chain_drafter(drafter, rates)


def drafter_memory(drafter: Drafter, target: ModelConfig, dtype: str, tp: int) -> DrafterMemory:
    """What `drafter` holds beside `target` over a replica of tp devices: a feature-level
    drafter's head (or the checkpoint's MTP modules) and its layers' KV cache, a draft model's
    weights and KV cache (from its config: without one its memory is not known, one line), none
    for n-gram lookup."""
    kind, size = DrafterKind(drafter.name), element_bytes(dtype)
    if kind == DrafterKind.NGRAM:
        return DrafterMemory(0.0, 0.0, "the n-gram lookup")
    if kind == DrafterKind.DRAFT:
        own = drafter.draft_model
        if own is None:
            raise PerfkitError(
                "--drafter draft: the draft model's memory is its own config's; give --draft-config (its config.json)"
            )
        weights, kv = weight_params(own) * size, replica_kv_bytes_per_token(own, dtype, tp)
        return DrafterMemory(weights, kv, f"the draft model {own.name}")
    head = (drafter.weights or DraftWeights(kind)).layer
    if head is None:  # one layer of the target's shapes; an MTP checkpoint's every module
        mtp = kind == DrafterKind.MTP
        head = layer_slice(target, target.mtp_layers if mtp else 1, dense=not mtp)
    what = "the MTP module(s)" if kind == DrafterKind.MTP else f"the {KIND_NAMES[kind]} head"
    weights = feature_head_bytes(kind, head, target, dtype)
    return DrafterMemory(weights, replica_kv_bytes_per_token(head, dtype, tp), what)


@dataclass(frozen=True)
class MeasuredChain:
    """A drafter's measured chains as a plan or a serving search asks for them: its kind, its
    per-position rates and its own config.json (perfmodel.models.drafter_config), built on each
    deployment it is priced on (drafter_on)."""

    drafter: DrafterKind
    rates: tuple[float, ...]
    draft_config: str | Path | None = None

    @property
    def acceptance(self) -> ChainAcceptance:
        return ChainAcceptance(self.rates)

    @property
    def sizes(self) -> np.ndarray:
        """Tokens verified a step, plain decoding's 1 to the longest chain's."""
        return np.arange(1, len(self.rates) + 2)

    def drafter_on(self, deployment: Deployment) -> Drafter:
        return measured_drafter(self.drafter, self.rates, deployment, self.draft_config)

    def describe(self) -> str:
        return f"{KIND_NAMES[self.drafter]}: {self.acceptance.describe()}; a tree of n tokens is its chain of n - 1"


def measured_chain(drafter: str, position_rates, draft_config: str | Path | None = None) -> MeasuredChain | None:
    """The measured chains asked for (None: the Medusa heads' trees); a drafter without its
    rates, or rates or a config without a drafter, is one line."""
    kind = DrafterKind(check_setting(drafter, KIND_NAMES, "drafter"))
    if kind == DrafterKind.MEDUSA:
        if position_rates is not None or draft_config is not None:
            raise PerfkitError(
                "--position-rates (and --draft-config) price another drafter's measured chains: name it with "
                "--drafter eagle, eagle3, mtp, draft or ngram; the Medusa heads take --acceptance-rates"
            )
        return None
    if position_rates is None:
        raise PerfkitError(
            f"--drafter {kind}: its chains are priced from its measured per-position acceptance; give "
            "--position-rates R1 .. RK"
        )
    return MeasuredChain(kind, ChainAcceptance(tuple(float(r) for r in position_rates)).rates, draft_config)
