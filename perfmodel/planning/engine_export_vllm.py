"""A speculation schedule as vLLM loads it: per chain, the --speculative-config JSON, and the
dynamic-speculation table num_speculative_tokens_per_batch_size over batch (and context)
ranges (perfmodel.planning.engine_exports' module doc gives the format and its sources).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.ngram_host import LOOKUP_N
from perfmodel.planning.drafters import KIND_NAMES
from perfmodel.planning.engine_export_common import Weights, by_tree, file_stem
from perfmodel.planning.schedule_format import ScheduleBand, SpeculationSchedule, compact_json

# ----------------------------------------------------------------------------- vLLM

# SpeculativeConfig's `method` of each drafter:
# medusa https://docs.vllm.ai/en/latest/features/speculative_decoding/ (MedusaProposer),
# eagle https://docs.vllm.ai/en/latest/features/speculative_decoding/eagle/,
# draft_model https://docs.vllm.ai/en/latest/features/speculative_decoding/draft_model/
# eagle3, mtp (vLLM >= 0.11; 0.10 names it deepseek_mtp) and ngram: vllm/config/speculative.py (0.11.0-0.12.0)
# and https://docs.vllm.ai/en/latest/features/speculative_decoding/ (its eagle, mtp and n_gram pages)
VLLM_METHODS = {
    "medusa": "medusa",
    "eagle": "eagle",
    "draft": "draft_model",
    "eagle3": "eagle3",
    "mtp": "mtp",
    "ngram": "ngram",
}
# The n-grams looked up, stated rather than left to vLLM's rule (5-grams only where neither is set):
# the range the lookup's host cost was measured at (perfmodel.measured.ngram_host.LOOKUP_N).
NGRAM_LOOKUP = {"prompt_lookup_max": LOOKUP_N[1], "prompt_lookup_min": LOOKUP_N[0]}


def vllm_drafter(drafter: str, weights: Weights) -> dict:
    """The keys naming who drafts: the method, and the weights where the drafter has its own (an
    MTP module is read from the target's checkpoint: vLLM fills `model` in), n-gram's lookup."""
    if drafter == DrafterKind.NGRAM:
        return {"method": VLLM_METHODS[drafter], **NGRAM_LOOKUP}
    if drafter == DrafterKind.MTP:
        return {"method": VLLM_METHODS[drafter]}
    return {"method": VLLM_METHODS[drafter], "model": weights[drafter]}


def check_vllm(schedule: SpeculationSchedule) -> None:
    """vLLM drafts chains: its Medusa one token per head, at most the model's heads; its EAGLE
    one token per draft pass (top-1); a draft model its gamma. Refuse any other tree."""
    for band in schedule.bands:
        if band.drafter == DrafterKind.MEDUSA and (not band.chain or band.draft_tokens > schedule.medusa_heads):
            raise PerfkitError(
                f"vLLM's Medusa drafts one token per head (a chain of at most {schedule.medusa_heads}); the tree of "
                f"{band.tree_size} tokens at {band.label()} is not one: export vLLM from a chain schedule "
                "(speculation_schedule(..., family='chain'))"
            )
        if band.drafter == DrafterKind.EAGLE and not band.chain:
            raise PerfkitError(
                f"vLLM's EAGLE drafts one token per pass (top-1, a chain); the EAGLE tree of {band.tree_size} tokens "
                f"(top-{band.top_k}) at {band.label()} is not one: export vLLM from a chain schedule "
                "(speculation_schedule(..., family='chain'))"
            )


def vllm_band_config(band: ScheduleBand, weights: Weights) -> dict | None:
    """The --speculative-config of one band's chain, or None (off: no speculative config)."""
    if not band.speculate:
        return None
    config = {**vllm_drafter(band.drafter, weights), "num_speculative_tokens": band.draft_tokens}
    # A chain is vLLM's own Medusa draft (each head's top-1), so no speculative_token_tree: the
    # key says nothing more, and vLLM 0.32.0 refuses it as an unexpected keyword.
    return config


@dataclass(frozen=True)
class KGrid:
    """The schedule as a rectangular (batch x context) grid of K = draft tokens (0 = off), with
    neighbouring rows and columns of equal K merged."""

    batches: list[tuple[int, int]]
    contexts: list[tuple[int, int]]
    k: np.ndarray  # (batches, contexts)


def k_grid(schedule: SpeculationSchedule) -> KGrid:
    batch_edges = sorted({b.batch_min for b in schedule.bands})
    context_edges = sorted({b.context_min for b in schedule.bands})
    k = np.array([[schedule.band(b, c).draft_tokens for c in context_edges] for b in batch_edges], dtype=np.int64)
    batch_ranges, k = merged(spans(batch_edges, max(b.batch_max for b in schedule.bands)), k)
    context_ranges, kt = merged(spans(context_edges, max(b.context_max for b in schedule.bands)), k.T)
    return KGrid(batch_ranges, context_ranges, kt.T)


def spans(edges: list[int], last: int) -> list[tuple[int, int]]:
    return [(lo, hi - 1) for lo, hi in zip(edges, edges[1:])] + [(edges[-1], last)]


def merged(ranges: list[tuple[int, int]], rows: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Neighbouring ranges whose rows are equal, as one range."""
    keep_ranges, keep_rows = [ranges[0]], [rows[0]]
    for span, row in zip(ranges[1:], rows[1:]):
        if np.array_equal(row, keep_rows[-1]):
            keep_ranges[-1] = (keep_ranges[-1][0], span[1])
        else:
            keep_ranges.append(span)
            keep_rows.append(row)
    return keep_ranges, np.array(keep_rows)


def vllm_note(schedule: SpeculationSchedule) -> str | None:
    """Why vLLM gets no dynamic-speculation table, where its bands run several drafters."""
    if len(schedule.drafters) < 2:
        return None
    names = ", ".join(KIND_NAMES[d] for d in schedule.drafters)
    return (
        f"vLLM loads one drafter per server and its dynamic table switches K, not the drafter: this schedule's "
        f"bands run {names}, so vLLM gets one fixed config per band and no dynamic table"
    )


def vllm_dynamic_config(schedule: SpeculationSchedule, weights: Weights, context: int | None = None) -> dict | None:
    """vLLM's dynamic-speculation config: num_speculative_tokens (the largest K) and the table
    num_speculative_tokens_per_batch_size. context None: the whole grid, as
    [bs_lo, bs_hi, ctx_lo, ctx_hi, K] where the schedule has several context bands; else the
    [bs_lo, bs_hi, K] table of the context band holding `context`. None where K is 0
    everywhere (off: no speculative config) or the bands run several drafters (vllm_note)."""
    check_vllm(schedule)
    if vllm_note(schedule) is not None:
        return None
    grid = k_grid(schedule)
    if context is None and len(grid.contexts) > 1:
        table = [
            [b_lo, b_hi, c_lo, c_hi, int(grid.k[i, j])]
            for i, (b_lo, b_hi) in enumerate(grid.batches)
            for j, (c_lo, c_hi) in enumerate(grid.contexts)
        ]
        k = grid.k
    else:
        j = 0 if context is None else next(j for j, (lo, hi) in enumerate(grid.contexts) if lo <= context <= hi)
        batches, k = merged(grid.batches, grid.k[:, [j]])
        table = [[lo, hi, int(row[0])] for (lo, hi), row in zip(batches, k)]
    if k.max() == 0:
        return None
    (drafter,) = schedule.drafters
    return {
        **vllm_drafter(drafter, weights),
        "num_speculative_tokens": int(k.max()),
        "num_speculative_tokens_per_batch_size": table,
    }


def dump_json(data: dict) -> str:
    return compact_json(data) + "\n"


def vllm_files(schedule: SpeculationSchedule, weights: Weights) -> dict[str, str]:
    check_vllm(schedule)
    files = {}
    dynamic = vllm_dynamic_config(schedule, weights)
    if dynamic is not None:
        files["speculative-config.dynamic.json"] = dump_json(dynamic)
        contexts = k_grid(schedule).contexts
        for lo, hi in contexts if len(contexts) > 1 else ():
            one = vllm_dynamic_config(schedule, weights, context=lo)
            if one is not None:
                files[f"speculative-config.dynamic.context-{lo}-{hi}.json"] = dump_json(one)
    for bands in by_tree(schedule).values():
        config = vllm_band_config(bands[0], weights)
        if config is not None:
            files[f"speculative-config.{file_stem(bands[0])}.json"] = dump_json(config)
    files["schedule.json"] = schedule.to_json() + "\n"  # the chain schedule these rest on
    return files
