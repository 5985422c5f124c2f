"""The closed loop's prediction: every measured run priced by the performance model,
from the operators timed beside it and the acceptance of the untimed passes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.acceptance.batching import attended_context, batch_acceptance, simulated_tokens
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.latency.calibration import MeasuredLatency
from perfmodel.latency.eagle import EagleStep
from perfmodel.latency.step import StepModel
from perfmodel.models.config import ModelConfig
from profilers.closed_loop.config import STEP_FLAVOR, TARGET_ERROR, ValidateConfig
from profilers.closed_loop.eagle import DraftHost, draft_shapes
from profilers.closed_loop.in_step import HOST
from profilers.closed_loop.tree_kind import TreeKind
from profilers.closed_loop.untimed import UntimedPasses

# Which operators of the reference step run in which phase of the decoder's step; the
# rest (embedding, layers, LM head, mask) is its forward pass.
DECODER_PHASE_OPS = {
    "candidates": ("medusa_heads", "candidates"),
    "forward": (),
    "verification": ("verify",),
    "kv_update": ("kv_move",),
}


def predicted_acceptance(kind: str, size: int, record: UntimedPasses, config: ValidateConfig) -> tuple[float, float]:
    """(tokens per step of one sequence, tokens per sequence and step of the batch)."""
    if kind == TreeKind.PLAIN:
        return 1.0, 1.0
    generations = record.generations[kind, size]
    return (
        batch_acceptance(generations, 1, config.new_tokens),
        batch_acceptance(generations, config.batch, config.new_tokens),
    )


def accuracy_acceptance(kind: str, size: int, record: UntimedPasses, config: ValidateConfig) -> float:
    """Tokens per sequence and step of the batch from the head accuracies alone, heads
    independent and steps alike (what perfmodel predicts from a checkpoint's accuracies);
    NaN for a dynamic tree, which has no fixed tree to value."""
    if kind != TreeKind.STATIC:
        return float("nan")
    generations = simulated_tokens(record.survivals[kind, size], config.new_tokens, seed=config.seed)
    return batch_acceptance(generations, config.batch, config.new_tokens)


def step_contexts(record: UntimedPasses, config: ValidateConfig) -> dict[tuple[str, int], int]:
    """Cached tokens each run's steps attend to, on average: the mean context for plain
    decoding (every sequence a token a step, so none leads); for a tree, the batch's
    leading sequence's (perfmodel.acceptance.batching.attended_context), which the reference decoder
    pads the others to."""
    return {
        (kind, size): config.context
        if kind == TreeKind.PLAIN
        else round(attended_context(record.generations[kind, size], config.batch, config.prompt_len, config.new_tokens))
        for kind, size in record.settings
    }


def predicted_phases(step: StepModel, batch: int, contexts, sizes, host_s: float) -> dict[str, np.ndarray]:
    """Predicted seconds per step in each of the decoder's phases (decoder.medusa.STEP_PARTS):
    its operators grouped by the phase that runs them, the host overhead in the forward."""
    phases = {f"predicted_{phase}_s": np.zeros(len(sizes)) for phase in DECODER_PHASE_OPS}
    for op, seconds in step.op_times(batch, np.asarray(contexts), np.asarray(sizes)).items():
        phase = next((p for p, ops in DECODER_PHASE_OPS.items() if op in ops), "forward")
        phases[f"predicted_{phase}_s"] += seconds
    phases["predicted_forward_s"] += host_s
    return phases


@dataclass
class Measured:
    """What one closed loop measured: its runs (timed_runs' rows, plain decoding first),
    the operator rows and plain step timed beside them, the cached tokens each run's steps
    attend to, the seconds a dynamic tree of each size takes to build, and with EAGLE the
    seconds of each probe draft (profilers.closed_loop.eagle.PROBE_TREES) timed alone."""

    runs: list[dict]
    rows: pd.DataFrame
    plain_step_s: float
    contexts: dict[tuple[str, int], int]
    build_s: dict[int, float]
    drafts_s: list[float] = dataclasses.field(default_factory=list)  # EAGLE: each probe draft timed alone


def priced_runs(
    config: ValidateConfig, model: ModelConfig, dtype: str, record: UntimedPasses, measured: Measured
) -> tuple[pd.DataFrame, dict]:
    """(per-tree comparison, summary): each Medusa run's predicted speedup beside its
    measured one, and the calibration behind them."""
    runs, rows, plain_step_s = measured.runs, measured.rows, measured.plain_step_s
    contexts, build_s = measured.contexts, measured.build_s
    latency = MeasuredLatency(rows, model.name, dtype)
    step = StepModel(model, latency, STEP_FLAVOR, with_heads=config.drafter == DrafterKind.MEDUSA)
    sizes = np.array([r["tree_size"] for r in runs])
    attended = np.array([contexts[r["tree_kind"], r["tree_size"]] for r in runs])
    ops_plain = float(step.step_time(config.batch, config.context, 1))
    ops_tree = step.step_time(config.batch, attended, sizes)
    host = plain_step_s - ops_plain
    # a dynamic tree is built on the host for every sequence of every step
    tree_build = np.array(
        [build_s.get(r["tree_size"], 0.0) if r["tree_kind"] == TreeKind.DYNAMIC else 0.0 for r in runs]
    )
    tree_build = tree_build * config.batch
    draft_ops, draft_host, drafting = np.zeros(len(runs)), np.zeros(len(runs)), None
    if config.drafter == DrafterKind.EAGLE:  # the tree drafted before the step verifies it
        run_shape, probe_shape = draft_shapes(record)
        eagle = EagleStep(step, model, latency, STEP_FLAVOR, run_shape)
        draft_ops = eagle.draft_time(config.batch, attended, sizes)
        drafting = DraftHost.fit(eagle, probe_shape, config.batch, config.context, measured.drafts_s)
        draft_host = drafting.seconds(run_shape, sizes)
    ops_tree = ops_tree + draft_ops
    table = pd.DataFrame(runs)
    decoded_plain_step_s = float(table["measured_step_s"].iloc[0])
    acceptance = [predicted_acceptance(r["tree_kind"], r["tree_size"], record, config) for r in runs]
    table["predicted_acceptance"] = [alone for alone, _ in acceptance]
    table["predicted_batch_acceptance"] = [batch for _, batch in acceptance]
    table["measured_batch_acceptance"] = [r["batch_acceptance"] for r in runs]
    table["attended_context"] = attended
    table = table.assign(**predicted_phases(step, config.batch, attended, sizes, host))
    table["predicted_candidates_s"] += tree_build + draft_ops + draft_host
    table["ops_step_s"] = ops_tree
    table["dynamic_tree_build_s"] = tree_build
    table["draft_host_s"] = draft_host
    table["predicted_step_s"] = ops_tree + host + tree_build + draft_host
    table["predicted_speedup"] = table["predicted_batch_acceptance"] / (table["predicted_step_s"] / plain_step_s)
    table["ops_only_speedup"] = table["predicted_batch_acceptance"] / (ops_tree / ops_plain)
    table["error"] = (table["predicted_speedup"] - table["measured_speedup"]) / table["measured_speedup"]
    # The same prediction with the acceptance head accuracies alone give (the planner's input
    # for a checkpoint), to show what a replay of the heads' record adds.
    table["accuracy_batch_acceptance"] = [
        accuracy_acceptance(r["tree_kind"], r["tree_size"], record, config) for r in runs
    ]
    accuracy_speedup = table["accuracy_batch_acceptance"] / (table["predicted_step_s"] / plain_step_s)
    table["accuracy_error"] = accuracy_speedup / table["measured_speedup"] - 1
    table["batch"], table["context"], table["acceptance_scheme"] = config.batch, config.context, config.acceptance
    table["drafter"] = config.drafter
    # Which device and model the comparison describes, so reports can match it to theirs.
    table["device"], table["model"], table["dtype"] = rows["device"].iloc[0], model.name, dtype
    phases = table[[c for c in table.columns if c.endswith("_s") and c.split("_", 1)[1][:-2] in DECODER_PHASE_OPS]]
    phases = phases.assign(tree_kind=table["tree_kind"], tree_size=sizes)
    table = table[table["tree_kind"] != TreeKind.PLAIN].reset_index(drop=True)
    op_times = step.op_times(config.batch, attended, sizes)
    priced_ops = {
        (r["tree_kind"], r["tree_size"]): {op: float(t[i]) for op, t in op_times.items()} | {HOST: host}
        for i, r in enumerate(runs)
    }
    summary = {
        "priced_ops": priced_ops,  # each run's seconds per step by operator, and the host overhead
        "threads": config.threads,
        "plain_step_s": plain_step_s,
        "decoded_plain_step_s": decoded_plain_step_s,
        "ops_plain_step_s": ops_plain,
        "host_overhead_s": host,
        "max_abs_error": float(table["error"].abs().max()),
        "within_target": bool((table["error"].abs() <= TARGET_ERROR).all()),
        "phases": phases,
        "drafting": drafting,
    }
    columns = [
        "device",
        "model",
        "dtype",
        "acceptance_scheme",
        "drafter",
        "tree_kind",
        "tree_size",
        "batch",
        "context",
        "attended_context",
        "predicted_acceptance",
        "measured_acceptance",
        "predicted_batch_acceptance",
        "measured_batch_acceptance",
        "predicted_step_s",
        "measured_step_s",
        "ops_step_s",
        "predicted_speedup",
        "measured_speedup",
        "error",
        "accuracy_batch_acceptance",
        "accuracy_error",
        "ops_only_speedup",
        "dynamic_tree_build_s",
        "draft_host_s",
        "lossless",
        *[c for c in phases.columns if c.endswith("_s")],
    ]
    return table[columns], summary
