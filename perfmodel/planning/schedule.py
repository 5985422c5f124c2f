"""A speculation schedule: for one device, model, tensor-parallel degree and acceptance record,
the drafter and tree to run (or "off") for each band of batch size and context length, with
the predicted speedup over plain decoding and what the step times rest on.

Engines load it through perfmodel.planning.engine_exports (vLLM, SGLang, TensorRT-LLM, and
this module's own JSON); `python -m perfmodel.schedule` prints and writes it;
perfmodel.planning.schedule_regret scores it against closed-loop measurements.

The drafter (`drafter=`, perfmodel.planning.drafters): `medusa` (the default) runs the Medusa
heads' trees; `eagle` EAGLE's trees (EAGLE-2's top-k expansion: a budget of n tokens, its depth
and top-k); `draft` a draft model's chain of gamma tokens; `best` whichever of the three is best
in each band, or off. From a measured per-position acceptance (`position_rates`), one drafter's
chains instead: EAGLE-3's, an MTP module's, n-gram lookup's (which have no curve shipped), or
EAGLE's and a draft model's (perfmodel.planning.measured_chain), each band the chain of 1 .. K
drafts of the highest speedup. Each drafter is priced by its own step model and acceptance
(Drafter.step, Drafter.acceptance): nothing here prices a step.

How the bands are made:

- The best tree is evaluated at every point of a grid of batches (default: powers of two up
  to 256) x contexts (default 512 to 16384 tokens, those within the model's trained context)
  by the one rule of every best tree (perfmodel.planning.simulations.pick_best: the highest
  speedup, the smaller tree on ties, plain decoding where no tree beats it), per drafter over
  its own sizes. `medusa="on"` takes the best tree of two tokens or more everywhere, even
  where it loses; `"off"` none (the setting applies to whichever drafter runs).
- With `best`, each point runs the drafter whose best tree has the highest speedup there
  (perfmodel.planning.drafter_choice.best_drafters' rule: pick_best again, over the drafters'
  best trees), off where none beats plain decoding.
- The floor rule: grid point g_i stands for the values g_i .. g_(i+1) - 1, the first grid
  point from 1, the last for itself and, on lookup, everything beyond it (an edge band: it
  was not evaluated there). So batch 3 runs the tree of batch 2. Step times grow with batch
  and context, so the floor is the optimistic side: a band's tree is the best at its lowest
  batch and context.
- Adjacent cells with the same drafter and tree merge into one band: along batch within each
  context, then contexts whose batch runs agree. The bands tile the grid as rectangles, no
  gaps and no overlaps (SpeculationSchedule checks it), which is the shape vLLM's (batch x
  context) table takes.
- A band's speedup is the lowest predicted among its grid points (what it can promise); its
  acceptance, the tokens per step of its tree.

The Medusa trees come from the acceptance record's head accuracies (the greedy tree of each
size, perfmodel.acceptance.trees), or without one (the paper's preset) from the reference
implementation's Vicuna-7B tree, whose first n - 1 nodes are its own tree of n tokens: at
most 64 tokens. Sizes no tree of exactly that size exists for, or that need more heads than
the model has, are not searched; the schedule's notes say which. EAGLE's tree is drawn anew
each step (EAGLE-2), so its bands carry its budget, depth and top-k, not paths; a draft
model's band carries its gamma (its depth). A `chain` schedule searches chains of one token
per head (the top-1 of heads 1..k, at most the model's heads) or per EAGLE pass (top-1) instead,
which is all vLLM's Medusa and EAGLE draft by default: its engine export is made from one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.acceptance.rates import AcceptanceSetting
from perfmodel.base.checks import split_options
from perfmodel.base.drafter_kind import MEASURED_ONLY, DrafterChoice, DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.choice import LatencyMode
from perfmodel.latency.eagle import DraftShape
from perfmodel.models.config import ModelConfig
from perfmodel.planning.capacity import Ints, positive_ints
from perfmodel.planning.deployment import Deployment, DeploymentChoices, resolve
from perfmodel.planning.drafter_point import tokens_per_step
from perfmodel.planning.drafters import (
    DEFAULT_DRAFT_ALPHA,
    DEFAULT_DRAFT_COST,
    DRAFTER_NAMES,
    Drafter,
    drafters_for,
    eagle_drafter,
)
from perfmodel.planning.measured_chain import ChainAcceptance, measured_drafter
from perfmodel.planning.medusa_setting import MedusaSetting, check_medusa
from perfmodel.planning.schedule_bands import best_cells, default_batches, default_contexts, merge_bands
from perfmodel.planning.schedule_format import (
    ACCEPTANCE_SEPARATOR,
    OFF,
    SpeculationSchedule,
    TreeFamily,
    check_drafter,
    check_family,
)
from perfmodel.planning.schedule_trees import TreeBook, tree_book
from perfmodel.planning.simulations import CANDIDATE_SIZES, speedup_table


def view_evidence(view, step) -> str:
    """The step's evidence (StepCost.evidence), where a CPU's roofline says `ceilings`: it has
    no datasheet, its roofline is its own measured ceilings."""
    evidence = step.evidence
    return "ceilings" if view.is_cpu and evidence == LatencyMode.DATASHEET else evidence


def drafted_fields(drafter: Drafter | None, size: int) -> dict:
    """The band fields of `drafter`'s tree of `size` tokens (None or size 1: off): the tree, the
    drafter, what an engine needs to draft it (ScheduleBand's depth and top_k) and its tokens
    per step. A Medusa drafter's acceptance is its TreeBook, which holds the tree."""
    if drafter is None or size == 1:
        return dict(tree_size=1, paths=(), acceptance=1.0, drafter=OFF, depth=0, top_k=0)
    if drafter.name == DrafterKind.MEDUSA:
        tree = drafter.acceptance.trees[size]
        shape = dict(paths=tree.paths, depth=tree.depth, top_k=tree.max_rank + 1)
    elif drafter.name == DrafterKind.EAGLE:
        # the width of EAGLE's last pass: the nodes every pass after the first expands (DraftShape)
        passes = drafter.shape.pass_tokens(size)
        shape = dict(paths=(), depth=len(passes), top_k=int(passes[-1]))
    else:  # a chain of size - 1 drafts: a draft model's gamma, a measured chain's K
        shape = dict(paths=(), depth=size - 1, top_k=1)
    return dict(tree_size=size, acceptance=float(drafter.acceptance(size)), drafter=drafter.name, **shape)


EAGLE_CHAIN_NOTE = (
    "EAGLE chains: one token per draft pass (top-1), as vLLM's EAGLE drafts; a chain is credited the EAGLE "
    "curve's tokens per step at its size, a curve of trees that says little of chains"
)


def searched_drafters(
    drafter: str, acceptance, model: ModelConfig, sizes: np.ndarray, family: str, alpha: float, cost_ratio: float
) -> tuple[list[Drafter], list[str]]:
    """The drafters a schedule of `drafter` searches (all three for best; drafters_for, which
    refuses an acceptance of another drafter), each with the sizes searched (Drafter.sizes,
    root included), and the notes on what was left out. Medusa's acceptance becomes its
    TreeBook (the trees of `sizes`, or its chains), EAGLE's chain family drafts top-1 up to its
    depth; EAGLE's trees are searched over `sizes`, the draft model over its own gammas."""
    several = drafter == DrafterChoice.BEST
    out, notes = [], []
    for found in drafters_for(DrafterChoice.ALL if several else drafter, acceptance, alpha, cost_ratio):
        if found.name == DrafterKind.MEDUSA:
            if model.medusa_heads:
                book = tree_book(found.choice, sizes[sizes > 1], model.medusa_heads, family)
                notes += book.notes
            else:
                book = TreeBook()
                notes.append(
                    f"{model.name} has no Medusa heads: "
                    + ("Medusa is not searched" if several else "plain decoding everywhere")
                )
            found = dataclasses.replace(found, acceptance=book, sizes=(1, *sorted(book.trees)))
        elif found.name == DrafterKind.EAGLE and family == TreeFamily.CHAIN:
            shape = DraftShape(found.shape.depth, top_k=1)
            found = dataclasses.replace(eagle_drafter(found.choice, shape), sizes=tuple(range(1, shape.depth + 2)))
            notes.append(EAGLE_CHAIN_NOTE)
        elif found.name == DrafterKind.EAGLE:
            found = dataclasses.replace(found, sizes=tuple(int(n) for n in np.union1d(sizes, [1])))
        out.append(found)
    return out, notes


def edge_note(drafter: Drafter, cells: pd.DataFrame, family: str, named: bool) -> list[str]:
    """The note where a drafter's best tree is somewhere the largest it searched (a bound: a
    larger one may do better); a chain family's Medusa and EAGLE chains end at their depth."""
    top = max(drafter.sizes)
    if len(drafter.sizes) <= 2 or not (cells["tree_size"] == top).any():
        return []
    if isinstance(drafter.acceptance, ChainAcceptance):
        text = (
            f"the longest chain the rates cover ({top - 1} drafts) is the best somewhere: a longer one may do better, "
            "its acceptance not measured"
        )
    elif drafter.name == DrafterKind.DRAFT:
        text = f"the longest draft searched (gamma {top - 1}) is the best somewhere: a longer one may do better"
    elif family == TreeFamily.TREE:
        text = f"the largest tree searched ({top} tokens) is the best somewhere: a larger one may do better"
    else:
        return []
    # beside other drafters, its own best: the schedule may run another drafter there
    return [f"{DRAFTER_NAMES[drafter.name]}: {text.replace(' is the best', ' is its best')}" if named else text]


def acceptance_label(drafters: list[Drafter]) -> str:
    """What each drafter's acceptance (and, EAGLE's and a draft model's, its shape) assumes."""
    if len(drafters) == 1:
        return drafters[0].describe()
    return ACCEPTANCE_SEPARATOR.join(f"{DRAFTER_NAMES[d.name]}: {d.describe()}" for d in drafters)


@dataclass(frozen=True)
class ScheduleRequest:
    """What a speculation schedule is asked, beside its deployment.

    acceptance: anything resolve_acceptance reads; None: each drafter's preset (the paper's
    for Medusa, EAGLE-2's for EAGLE). batches, contexts: the grid (None: default_batches(),
    default_contexts(the model's context)). medusa: auto, on or off. sizes: tree sizes to
    search, root included (1 is always among them; Medusa's and EAGLE's, the draft model
    searches gamma 1..8). family: tree (the best tree of each size) or chain (one token per
    head or EAGLE pass, the trees vLLM drafts). drafter: medusa, eagle, draft or best
    (SCHEDULE_DRAFTERS); alpha and cost_ratio: the draft model's (perfmodel.planning.drafters).
    position_rates: a chain's measured per-position acceptance, which any drafter but Medusa's
    heads is scheduled from (eagle3, mtp and ngram only so): the chains of 1 .. len(rates)
    drafts are searched (perfmodel.planning.measured_chain), not `sizes`; draft_config: the
    drafter's own config.json with them (a head's shapes, a draft model's own steps)."""

    acceptance: AcceptanceSetting = None
    batches: Ints | None = None
    contexts: Ints | None = None
    medusa: str = MedusaSetting.AUTO
    sizes: Ints = CANDIDATE_SIZES
    family: str = "tree"
    drafter: str = "medusa"
    alpha: float = DEFAULT_DRAFT_ALPHA
    cost_ratio: float = DEFAULT_DRAFT_COST
    position_rates: tuple[float, ...] | None = None
    draft_config: str | Path | None = None


def build_schedule(
    step, request: ScheduleRequest | None = None, deployment: Deployment | None = None, evidence: str | None = None
) -> SpeculationSchedule:
    """The schedule of one step model (a deployment's, perfmodel.planning.step_models.flavor_steps:
    the shard and its all-reduces) for `request`. deployment: the model (its name and heads),
    device, dtype and degree the schedule names (None: the step's model, no device, degree 1).
    evidence: what the step times rest on (default the step's own, StepCost.evidence)."""
    request = request or ScheduleRequest()
    medusa, family = check_medusa(request.medusa), check_family(request.family)
    drafter = check_drafter(request.drafter)
    model = deployment.model if deployment else step.model
    batches, contexts = request.batches, request.contexts
    batches = default_batches() if batches is None else positive_ints(batches, "batches")
    contexts = default_contexts(model.max_context) if contexts is None else positive_ints(contexts, "contexts")
    sizes = positive_ints(request.sizes, "tree sizes")
    alpha, cost_ratio = request.alpha, request.cost_ratio
    if request.position_rates is not None:
        if deployment is None:
            raise PerfkitError("a schedule from measured per-position rates is priced on a deployment: give one")
        kind = DrafterKind(drafter)
        found = measured_drafter(kind, request.position_rates, deployment, request.draft_config, cost_ratio)
        drafters, notes, family = [found], [], TreeFamily.CHAIN
    else:
        drafters, notes = searched_drafters(drafter, request.acceptance, model, sizes, family, alpha, cost_ratio)
    cells = []
    for searched in drafters:
        table = speedup_table(searched.step(step), searched.acceptance, batches, contexts, searched.sizes)
        cells.append(best_cells(table, medusa).assign(drafter=searched.name))
        notes += edge_note(searched, cells[-1], family, len(drafters) > 1)
    # the drafter whose best tree is fastest per point: pick_best once more, over the drafters' best cells
    best = best_cells(pd.concat(cells, ignore_index=True), medusa)
    by_name = {d.name: d for d in drafters}
    choices = [(d if n > 1 else OFF, int(n)) for d, n in zip(best["drafter"], best["tree_size"])]
    drafted = {c: drafted_fields(by_name.get(c[0]), c[1]) for c in choices}
    shape = (len(batches), len(contexts))  # best is in (batch, seq_len) order: batch-major, then context
    chosen = [choices[i * shape[1] : (i + 1) * shape[1]] for i in range(shape[0])]
    gains = best["speedup"].to_numpy().reshape(shape)
    if model.max_context and contexts.max() > model.max_context:
        notes.append(f"contexts beyond {model.name}'s {model.max_context}-token context are priced as if it ran there")
    bands = merge_bands(chosen, gains, batches, contexts, drafted, evidence or step.evidence)
    return SpeculationSchedule(
        device=deployment.device if deployment else "",
        model=model.name,
        tp=int(deployment.tp) if deployment else 1,
        dtype=deployment.dtype if deployment else "",
        acceptance=acceptance_label(drafters),
        latency=step.label,
        medusa=medusa,
        bands=tuple(bands),
        medusa_heads=model.medusa_heads,
        family=family,
        drafter=drafter,
        notes=tuple(notes),
        batch_grid=tuple(int(b) for b in batches),
        context_grid=tuple(int(c) for c in contexts),
    )


def speculation_schedule(model, device, **options) -> SpeculationSchedule:
    """The schedule of `model` (preset, config.json or ModelConfig) on `device` (a name, spec
    file or DeviceView; cpu: this machine's CPU). options: how it is deployed, the fields of
    perfmodel.planning.deployment.DeploymentChoices (dtype, tensor_parallel: default 1,
    latency: auto = measured where the device was measured, step: full, or traced with the
    decoder's tracer, ...), and what is asked, the fields of ScheduleRequest (acceptance,
    batches, contexts, medusa, sizes, family, drafter, alpha, cost_ratio; chain for vLLM's
    Medusa and EAGLE). schedule_deployment() takes a resolved deployment."""
    deployment, request = split_options(options, (DeploymentChoices, ScheduleRequest), "speculation_schedule()")
    request = ScheduleRequest(**request)
    check_request(request)
    return schedule_deployment(resolve(model, [device], DeploymentChoices(**deployment))[0], request)


def check_request(request: ScheduleRequest) -> None:
    """The request's settings checked, each in one line, before any deployment is priced."""
    check_medusa(request.medusa)
    check_family(request.family)
    drafter = check_drafter(request.drafter)
    if request.position_rates is None:
        if drafter in MEASURED_ONLY:
            raise PerfkitError(
                f"--drafter {drafter} is scheduled from its measured per-position acceptance (no acceptance curve of "
                "it is shipped): give --position-rates R1 .. RK (python -m perfmodel.speedup --metrics PAGE reads them "
                "from a vLLM server's /metrics)"
            )
        if request.draft_config is not None:
            raise PerfkitError("--draft-config goes with --position-rates: the drafter it shapes is a measured chain")
        return
    if drafter in (DrafterChoice.MEDUSA, DrafterChoice.BEST):
        raise PerfkitError(
            f"--position-rates schedules one drafter's measured chains (eagle, eagle3, mtp, draft, ngram), not "
            f"--drafter {drafter}: the Medusa heads' trees take --acceptance-rates"
        )
    if request.acceptance is not None:
        raise PerfkitError("give one of --position-rates or --acceptance-rates: each gives the acceptance")
    tokens_per_step(request.position_rates)


def schedule_deployment(deployment: Deployment, request: ScheduleRequest | None = None) -> SpeculationSchedule:
    """The schedule of a deployment priced by its own step (its flavour, from its latency
    source; its step model kept by the deployment, so a second schedule of it, say chains
    beside trees, prices no step again)."""
    request = request or ScheduleRequest()
    check_request(request)
    step = deployment.step_model()
    return build_schedule(step, request, deployment, view_evidence(deployment.view, step))
