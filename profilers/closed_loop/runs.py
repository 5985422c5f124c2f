"""What the closed loop measures: the decoder's runs, timed interleaved, and the
operators of its steps, timed in rounds between the batches of those runs."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from decoder.medusa import dynamic_tree
from decoder.runs import decode_interleaved, mean_accepted, warm_up
from decoder.tree import tree_buffers
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.step import op_points
from perfmodel.models.config import ModelConfig
from perfmodel.models.grid import QUICK_GRID
from perfmodel.models.operators import HEAD_TOP_K
from profilers.closed_loop.config import STEP_FLAVOR, ValidateConfig
from profilers.closed_loop.tree_kind import TreeKind
from profilers.closed_loop.untimed import UntimedPasses, decode_kwargs
from profilers.device import cpu_info, cuda_info
from profilers.sweeper import SweepConfig, Sweeper, default_timer

# The plain step is timed as generate(PROBE_LEAD + PROBE_STEPS) - generate(PROBE_LEAD).
PROBE_LEAD, PROBE_STEPS = 8, 32


@dataclasses.dataclass(frozen=True)
class ExtraTimings:
    """More to time in the operator rounds: op points (a drafter's) and calls (its drafts timed alone)."""

    points: Sequence = ()
    calls: Sequence = ()


def operator_timing(
    model: ModelConfig,
    config: ValidateConfig,
    dtype: str,
    decoder,
    probe_prompts,
    contexts: dict,
    log,
    extras: ExtraTimings = ExtraTimings(),
):
    """Every op call of the plain step and of each run's tree step (at the context its
    steps attend to, `contexts`: (kind, size) -> tokens), and the decoder's own plain step,
    ready to be timed in interleaved rounds that timed_runs spreads over the decoding runs
    (profilers.sweeper.InterleavedPoints; finish with `operator_rows`).

    The plain step is measured as the difference of two plain generations (PROBE_LEAD and
    PROBE_LEAD + PROBE_STEPS tokens from prompts of about the run's mean context), which
    cancels the prefill and setup. Timed beside the operators, it sees the machine in the
    same state as they do, so the host overhead (step minus its operators) carries no
    drift between the two measurements; and both are sampled between the batches of the
    decoding runs, so a machine whose speed wanders over minutes (a shared VM) is the same
    machine for the prediction and for the speedups it is compared with. `extras` are timed
    in the same rounds (operator_rows gives their calls' medians)."""

    info, nvml = (cpu_info(), None) if config.device == "cpu" else cuda_info()
    timer = default_timer(config.device, config.budget_s)
    if config.flush == "none":
        timer = dataclasses.replace(timer, flush_cache=False)
    elif config.flush == "model":
        timer = dataclasses.replace(
            timer, flush_bytes=sum(p.numel() * p.element_size() for p in decoder.model.parameters())
        )
    sweeper = Sweeper(SweepConfig(config.device, model, dtype, QUICK_GRID, Path("unused.csv"), timer=timer), info, nvml)
    sizes, seq_lens = np.array([n for _, n in contexts]), np.array(list(contexts.values()))
    points = op_points(
        model, STEP_FLAVOR, config.batch, seq_lens, sizes, with_heads=config.drafter == DrafterKind.MEDUSA
    )
    points += [point for point in dict.fromkeys(extras.points) if point not in set(points)]
    probes = [
        functools.partial(decoder.generate, probe_prompts, tokens) for tokens in (PROBE_LEAD, PROBE_LEAD + PROBE_STEPS)
    ] + list(extras.calls)
    log(
        f"timing {len(points)} operator points of the {model.name} step and the decoder's plain step on "
        f"{info.name}, interleaved with the decoding runs ..."
    )
    return sweeper.interleaved(points, "validate", extra_calls=probes)


def operator_rows(timing) -> tuple[pd.DataFrame, float, list[float]]:
    """Measured data-contract rows of the op points, the decoder's plain step (s), and the
    median seconds of operator_timing's extra calls."""
    rows, (short, long, *extras) = timing.finish()
    for row in rows:
        if row["status"] != "ok":
            raise PerfkitError(
                f"could not time {row['op']}/{row['phase']} at batch {row['batch']}, seq {row['seq_len']}, "
                f"candidates {row['candidates']}: {row['reason']}"
            )
    return pd.DataFrame(rows), (long.median_s - short.median_s) / PROBE_STEPS, [e.median_s for e in extras]


def timed_runs(
    decoder, prompts, config: ValidateConfig, record: UntimedPasses, log, between=lambda shares: None
) -> list[dict]:
    """Measured runs of plain decoding and every tree, one row per (tree kind, size).

    Plain decoding and every tree are timed interleaved, batch by batch
    (decoder.runs.decode_interleaved), so machine drift cancels in the speedups;
    `between(shares)` runs after each of the `shares` batches (the operator timings'
    rounds)."""
    kwargs = decode_kwargs(config)
    warm_up(decoder, prompts, config.batch, config.new_tokens, record.settings, **kwargs)
    sizes = ", ".join(str(n) for kind, n in record.settings if kind == TreeKind.STATIC)
    kinds = " and dynamic" if config.dynamic else ""
    drafted = ", drafted by EAGLE," if config.drafter == DrafterKind.EAGLE else ""
    log(
        f"timing plain decoding and static{kinds} trees of {sizes} tokens{drafted} interleaved, "
        f"{config.acceptance} acceptance, {config.decode_rounds} round(s) ..."
    )
    shares = config.decode_rounds * -(-len(prompts) // config.batch)
    results = decode_interleaved(
        decoder,
        prompts,
        config.batch,
        config.new_tokens,
        record.settings,
        config.decode_rounds,
        progress=lambda: between(shares),
        **kwargs,
    )
    baseline = results[(TreeKind.PLAIN, 1)]
    return [
        {
            "tree_kind": kind,
            "tree_size": size,
            "measured_acceptance": mean_accepted(result),
            "batch_acceptance": result.new_tokens / (result.steps * config.batch),
            "measured_step_s": result.decode_s / result.steps,
            "measured_speedup": result.tokens_per_s / baseline.tokens_per_s,
            "lossless": result.tokens == baseline.tokens if config.acceptance == "greedy" else None,
            **{f"measured_{phase}_s": seconds / result.steps for phase, seconds in result.times.items()},
        }
        for (kind, size), result in results.items()
    ]


def dynamic_build_s(decoder, step_probs: list[np.ndarray], nodes: int, repeats: int = 200) -> float:
    """Median seconds to build one sequence's dynamic tree and its buffers, as the decoder
    does every step, on recorded head probabilities."""
    probs = np.concatenate(step_probs)
    rng = np.random.default_rng(0)
    heads, times = probs.shape[1], []
    for i in rng.choice(len(probs), size=min(repeats, len(probs)), replace=False):
        padded = torch.zeros(heads, 2 * HEAD_TOP_K)  # topk of a full distribution, as in the decoder
        padded[:, :HEAD_TOP_K] = torch.from_numpy(probs[i])
        started = time.perf_counter()
        tree_buffers(dynamic_tree(padded, nodes, HEAD_TOP_K), heads, HEAD_TOP_K, decoder.device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)
