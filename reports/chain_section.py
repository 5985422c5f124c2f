"""The report's measured-chain section: a drafter's best chain per batch from the per-position
acceptance a team measured (reports build --drafter KIND --position-rates R1 .. RK), priced on
the page's own deployment and step, and the batch from which speculation stops paying
(perfmodel.planning.chain_choice.best_chains, the rule of python -m perfmodel.speedup
--best-chain and of a schedule's bands)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.chain_choice import best_chains
from perfmodel.planning.deployment import Deployment
from perfmodel.planning.drafters import KIND_NAMES
from perfmodel.planning.measured_chain import measured_drafter
from perfmodel.planning.simulations import loses_from
from reports.html import Page
from reports.report import BuildConfig

# --drafter on the page: medusa (the default) adds nothing, the heads' trees are the page's own.
CHAIN_PAGE_DRAFTERS = tuple(DrafterKind)


@dataclass(frozen=True)
class MeasuredChains:
    """What the section shows: the drafter, its rates, the context priced and each batch's best chain."""

    drafter: str
    rates: tuple[float, ...]
    context: int
    rows: pd.DataFrame  # perfmodel.planning.chain_choice.CHAIN_CHOICE_COLUMNS
    draft_config: Path | None = None


def check_chain_request(config: BuildConfig) -> None:
    """--drafter and --position-rates go together (Medusa's heads are the page's own), one line otherwise."""
    if config.drafter == DrafterKind.MEDUSA:
        if config.position_rates is not None or config.draft_config is not None:
            raise PerfkitError(
                "--position-rates (and --draft-config) add a drafter's measured chain to the page: name it with "
                "--drafter eagle, eagle3, mtp, draft or ngram"
            )
    elif config.position_rates is None:
        raise PerfkitError(
            f"--drafter {config.drafter}: the page shows its best chain per batch from its measured per-position "
            "acceptance; give --position-rates R1 .. RK"
        )


def measured_chains(config: BuildConfig, deployment: Deployment, flavor: str, context: int) -> MeasuredChains | None:
    """The drafter's best chain per batch on the page's deployment and step, or None where none was asked."""
    if config.position_rates is None:
        return None
    drafter = measured_drafter(DrafterKind(config.drafter), config.position_rates, deployment, config.draft_config)
    rows = best_chains(deployment.steps([flavor]), drafter, config.position_rates, context)
    return MeasuredChains(config.drafter, tuple(config.position_rates), context, rows, config.draft_config)


def chain_section(page: Page, chains: MeasuredChains | None) -> None:
    if chains is None:
        return
    name, rates = KIND_NAMES[chains.drafter], " ".join(f"{r:g}" for r in chains.rates)
    rows = chains.rows.sort_values("batch")
    config = f" --draft-config {chains.draft_config}" if chains.draft_config else ""
    command = f"--drafter {chains.drafter} --position-rates {rates}{config} --context {chains.context}"
    page.heading(f"Measured chain: {name}")
    page.paragraph(
        f"{name}'s best chain per batch, predicted from its measured per-position acceptance {rates} (a chain of K "
        f"drafts yields 1 + r_1 + ... + r_K tokens a step; chains longer than the rates are not searched), at "
        f"context {chains.context}; latency: {rows['latency_model'].iloc[0]}. python -m perfmodel.speedup "
        f"{command} --best-chain prints the same; python -m perfmodel.schedule with the same drafter and rates writes "
        "it per batch and context for vLLM, SGLang and TensorRT-LLM."
    )
    shown = pd.DataFrame(
        {
            "batch": rows["batch"].astype(str),
            "chain (drafts)": [str(k) if s else "off" for k, s in zip(rows["chain"], rows["speculate"])],
            "tokens/step": [f"{a:.2f}" for a in rows["acceleration"]],
            "plain step (ms)": [f"{t:.3f}" for t in rows["plain_step_ms"]],
            "step (ms)": [f"{t:.3f}" for t in rows["step_ms"]],
            "speedup (predicted)": [f"{x:.2f}x" for x in rows["speedup"]],
            "ms/token": [f"{t:.3f}" for t in rows["ms_per_token"]],
        }
    )
    page.table(shown)
    lost = loses_from(rows, "batch")
    page.paragraph(
        f"Speculation with {name} stops paying from batch {lost} on."
        if lost is not None
        else f"A chain of {name} pays at every batch shown, up to {int(rows['batch'].max())}.",
        note=True,
    )
