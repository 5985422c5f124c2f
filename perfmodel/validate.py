"""python -m perfmodel.validate: predict the Medusa speedup, then run the decoder and compare.

The closed loop, on this machine and the bundled model (or any checkpoint):
1. plain decoding of held-out prompts: the heads' top-k accuracies a_k^(i) on its output,
   which choose the greedy tree of each size, and the heads' predictions at every
   position of it, through which each tree's greedy steps are replayed (exactly the
   decoder's: verification is deterministic and the text is the plain pass's) for its
   acceptance; what the accuracies alone predict (heads independent) is shown beside;
2. measured speedups: plain decoding and Medusa with every tree, timed interleaved
   prompt by prompt (decoder.measure.decode_interleaved), so a drifting machine slows
   all of them alike;
3. operator latencies: every op of the reference decoder's step (perfmodel.latency.step, flavor
   `reference`) timed by the profilers at the run's batch, mean context and each tree
   size, and the decoder's own plain step, all sampled in turn in the same rounds, and
   those rounds taken between the batches of step 2, so that the prediction and the
   measurement see one machine even where its speed wanders by 10-20% over minutes;
4. prediction per tree size n: acceptance / (step(n) / step(1)), step(n) = the sum of its
   op latencies + the host overhead (Python, module calls and dispatch between the ops):
   the one calibrated constant, the plain step minus its ops, never from a Medusa run.
   A tree step's ops are timed at the context its attention spans: the decoder pads every
   sequence to the batch's longest, which runs ahead of the mean in a batch of prompts
   that accept at different rates (perfmodel.acceptance.batching.attended_context).
   The acceptance is each prompt's, and a batch steps until its slowest prompt is done
   (perfmodel.acceptance.batching counts the steps).

Acceptance schemes and trees: `--acceptance typical` predicts (simulates) from the
scheme's own record, head accuracies against what typical acceptance emits (an untimed typical pass
with the largest tree); `--dynamic` runs, beside every static tree, the dynamic tree of the
same node count (built each step from the heads' probabilities), predicted from those
probabilities mapped to hit rates measured on the plain pass, its step priced with the
measured cost of building the tree.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from decoder.acceptance import AcceptanceConfig
from decoder.checkpoint import load_checkpoint
from decoder.measure import head_accuracy
from decoder.medusa import Decoder, dynamic_tree
from decoder.runs import decode_batches, decode_interleaved, heldout_prompts, mean_accepted
from decoder.tree import tree_buffers
from perfmodel.acceptance.batching import (
    acceptance_survival,
    accepted_lengths,
    attended_context,
    batch_acceptance,
    dynamic_survival,
    probability_calibration,
    replayed_tokens,
    simulated_tokens,
)
from perfmodel.acceptance.trees import greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, batch_size, positive_int, run
from perfmodel.latency.calibration import MeasuredLatency
from perfmodel.latency.step import StepModel
from perfmodel.measured.contract import write_table
from perfmodel.models.config import load_model
from perfmodel.models.grid import QUICK_GRID
from perfmodel.models.operators import HEAD_TOP_K
from profilers.device import cpu_info, cuda_info
from profilers.sweep import SweepConfig, Sweeper, default_timer

DEFAULT_SIZES = (2, 4, 8, 16, 32, 64)
TARGET_ERROR = 0.10
# Which operators of the reference step run in which phase of the decoder's step; the
# rest (embedding, layers, LM head, mask) is its forward pass.
DECODER_PHASE_OPS = {
    "candidates": ("medusa_heads", "candidates"),
    "forward": (),
    "verification": ("verify",),
    "kv_update": ("kv_move",),
}
# The plain step is timed as generate(PROBE_LEAD + PROBE_STEPS) - generate(PROBE_LEAD).
PROBE_LEAD, PROBE_STEPS = 8, 32
# none: ops timed back to back, warm (a small model stays in a CPU's cache through a step);
# model: the cache flushed by the model's weight bytes between calls; all: evict everything
# (the paper's method for a 7B model on a GPU, whose weights never fit in L2).
FLUSH_MODES = ("none", "model", "all")
# Batches of prompts every setting decodes, at the least, by default (ValidateConfig.decode_rounds).
MIN_TIMED_BATCHES = 16
VALIDATED_SCHEMES = ("greedy", "typical")  # rejection sampling's baseline samples too: no fixed text to compare


@dataclass(frozen=True)
class ValidateConfig:
    device: str = "cpu"
    model: str = "bundled"
    sizes: tuple[int, ...] = DEFAULT_SIZES
    batch: int = 1
    prompts: int = 16
    prompt_len: int = 64
    new_tokens: int = 96
    budget_s: float = 0.3  # timer budget per operator point
    rounds: int | None = None  # interleaved passes over the prompts, every setting in each; None: decode_rounds
    flush: str = "none"  # cache state of the operator timings: none (warm), model, all
    threads: int = 1  # CPU threads for the decoder and the operator timings alike
    seed: int = 0
    acceptance: str = "greedy"  # greedy or typical
    dynamic: bool = False  # also run the dynamic tree of every size

    def __post_init__(self) -> None:
        if self.acceptance not in VALIDATED_SCHEMES:
            raise PerfkitError(f"acceptance must be one of {', '.join(VALIDATED_SCHEMES)}, got {self.acceptance!r}")
        if self.flush not in FLUSH_MODES:
            raise PerfkitError(f"flush must be one of {', '.join(FLUSH_MODES)}, got {self.flush!r}")
        if self.device not in ("cpu", "cuda"):
            raise PerfkitError(f"device must be cpu or cuda, got {self.device!r}")
        if self.rounds is not None and self.rounds < 1:
            raise PerfkitError(f"rounds must be >= 1, got {self.rounds}")
        if self.threads < 1:
            raise PerfkitError(f"threads must be >= 1, got {self.threads}")
        bad = [s for s in self.sizes if s < 2]
        if bad or not self.sizes:
            raise PerfkitError(f"tree sizes are tokens per step with the root, so >= 2; got {list(self.sizes)}")

    @property
    def decode_rounds(self) -> int:
        """`rounds`, or by default enough for every setting to decode MIN_TIMED_BATCHES
        batches of prompts (at least two rounds): at batch 8 sixteen prompts are two
        batches, and a plain run of two batches is a second of decoding, which one burst
        of the machine's noise can slow by 10%, and every speedup with it."""
        if self.rounds is not None:
            return self.rounds
        return max(2, -(-MIN_TIMED_BATCHES // self.batches))

    @property
    def batches(self) -> int:
        """Batches of prompts per pass over them."""
        return -(-self.prompts // self.batch)

    @property
    def context(self) -> int:
        """Mean tokens in the cache over a generation: prompt plus half the response."""
        return self.prompt_len + self.new_tokens // 2


def operator_timing(step: StepModel, config: ValidateConfig, dtype: str, decoder, probe_prompts, contexts: dict, log):
    """Every op call of the plain step and of each run's tree step (at the context its
    steps attend to, `contexts`: (kind, size) -> tokens), and the decoder's own plain step,
    ready to be timed in interleaved rounds that timed_runs spreads over the decoding runs
    (profilers.sweep.InterleavedPoints; finish with `operator_rows`).

    The plain step is measured as the difference of two plain generations (PROBE_LEAD and
    PROBE_LEAD + PROBE_STEPS tokens from prompts of about the run's mean context), which
    cancels the prefill and setup. Timed beside the operators, it sees the machine in the
    same state as they do, so the host overhead (step minus its operators) carries no
    drift between the two measurements; and both are sampled between the batches of the
    decoding runs, so a machine whose speed wanders over minutes (a shared VM) is the same
    machine for the prediction and for the speedups it is compared with."""

    info, nvml = (cpu_info(), None) if config.device == "cpu" else cuda_info()
    timer = default_timer(config.device, config.budget_s)
    if config.flush == "none":
        timer = dataclasses.replace(timer, flush_cache=False)
    elif config.flush == "model":
        timer = dataclasses.replace(
            timer, flush_bytes=sum(p.numel() * p.element_size() for p in decoder.model.parameters())
        )
    sweeper = Sweeper(
        SweepConfig(config.device, step.model, dtype, QUICK_GRID, Path("unused.csv"), timer=timer), info, nvml
    )
    points = {}
    sizes, seq_lens = np.array([n for _, n in contexts]), np.array(list(contexts.values()))
    for item, phase, b, s, q, _ in step.calls(config.batch, seq_lens, sizes):
        for point in zip(b.tolist(), s.tolist(), q.tolist()):
            points.setdefault((item.op, phase, *point), None)
    probes = [
        functools.partial(decoder.generate, probe_prompts, tokens, topk=HEAD_TOP_K)
        for tokens in (PROBE_LEAD, PROBE_LEAD + PROBE_STEPS)
    ]
    log(
        f"timing {len(points)} operator points of the {step.model.name} step and the decoder's plain step on "
        f"{info.name}, interleaved with the decoding runs ..."
    )
    return sweeper.interleaved(list(points), "validate", extra_calls=probes)


def operator_rows(timing) -> tuple[pd.DataFrame, float]:
    """Measured data-contract rows of the op points, and the decoder's plain step (s)."""
    rows, (short, long) = timing.finish()
    for row in rows:
        if row["status"] != "ok":
            raise PerfkitError(
                f"could not time {row['op']}/{row['phase']} at batch {row['batch']}, seq {row['seq_len']}, "
                f"candidates {row['candidates']}: {row['reason']}"
            )
    return pd.DataFrame(rows), (long.median_s - short.median_s) / PROBE_STEPS


@dataclass
class AcceptanceRecord:
    """What the untimed passes give the prediction: the trees and their acceptance."""

    accuracy: np.ndarray  # a_k^(i) of the scheme's record, all prompts
    per_prompt: list[np.ndarray]  # the same, each prompt's own
    hits: list[np.ndarray]  # per prompt (positions, heads, topk): which head predictions came (greedy, else [])
    step_probs: list[np.ndarray]  # per prompt (positions, heads, topk): the heads' top-k probabilities (--dynamic)
    calibrate: object  # heads' probability -> hit rate, measured on the record (--dynamic, else None)
    settings: dict  # (tree kind, size) -> decoder.generate keyword arguments, plain decoding first
    survivals: dict = dataclasses.field(default_factory=dict)  # (tree kind, size) -> each prompt's s[d]
    # (tree kind, size) -> each prompt's generations (perfmodel.acceptance.batching), what the prediction uses
    generations: dict = dataclasses.field(default_factory=dict)


def head_predictions(decoder, prompt, output) -> tuple[np.ndarray, np.ndarray]:
    """At each position where a step could start in one decoded prompt: the heads' top-k
    probabilities (positions, heads, topk), and whether each was the token that came
    (NaN where that token lies past the end)."""
    row = torch.tensor([prompt + output], device=decoder.device)
    with torch.inference_mode():
        logits = decoder.heads(decoder.model.hidden(row))[:, 0].float()  # (heads, T, V)
    top = torch.softmax(logits, -1).topk(HEAD_TOP_K, dim=-1)
    width, first = row.shape[1], len(prompt) - 1  # the step after the prompt's last token is the first
    positions = np.arange(first, width - 1)
    probs = top.values[:, positions].permute(1, 0, 2).cpu().numpy()
    hits = np.full(probs.shape, np.nan)
    for k in range(probs.shape[1]):
        target = positions + k + 2  # head k at t names token t + k + 2
        inside = target < width
        hits[inside, k] = (top.indices[k, positions[inside]] == row[0, target[inside], None]).cpu().numpy()
    return probs, hits


def decode_kwargs(config: ValidateConfig) -> dict:
    """decoder.generate's keyword arguments every pass of the run shares."""
    return dict(topk=HEAD_TOP_K, acceptance=AcceptanceConfig(config.acceptance, seed=config.seed))


def acceptance_record(decoder, prompts, config: ValidateConfig, log) -> AcceptanceRecord:
    """The untimed passes: plain decoding for the heads' accuracies, which choose the trees,
    and, with greedy acceptance, the heads' predictions at every position, which a static
    tree's steps are replayed through; with typical acceptance, then a typical pass with
    the largest tree for the scheme's own record (its acceptance simulated from accuracies:
    what it emits depends on the tree); with --dynamic, the heads' per-step probabilities
    and how often each probability was right."""
    kwargs = decode_kwargs(config)
    log(f"plain decoding of {len(prompts)} held-out prompts for the heads' accuracies ...")
    outputs = decode_batches(decoder, prompts, config.batch, config.new_tokens, **kwargs).tokens
    accuracy = head_accuracy(decoder, prompts, outputs)
    if config.acceptance != "greedy":
        log(f"{config.acceptance} acceptance with the largest tree, for the scheme's own record ...")
        largest = greedy_tree(accuracy, max(config.sizes) - 1)
        outputs = decode_batches(decoder, prompts, config.batch, config.new_tokens, tree=largest, **kwargs).tokens
        accuracy = head_accuracy(decoder, prompts, outputs)
    per_prompt = [head_accuracy(decoder, [p], [o]) for p, o in zip(prompts, outputs)]
    settings = {("plain", 1): {}} | {("static", n): {"tree": greedy_tree(accuracy, n - 1)} for n in config.sizes}
    greedy = config.acceptance == "greedy"
    predictions = (
        [head_predictions(decoder, p, o) for p, o in zip(prompts, outputs)] if greedy or config.dynamic else []
    )
    hits = [h for _, h in predictions] if greedy else []
    step_probs, calibrate = [], None
    if config.dynamic:  # only a dynamic tree is predicted from the heads' per-step probabilities
        settings |= {("dynamic", n): {"dynamic_nodes": n - 1} for n in config.sizes}
        step_probs = [probs for probs, _ in predictions]
        calibrate = probability_calibration(np.concatenate(step_probs), np.concatenate([h for _, h in predictions]))
    record = AcceptanceRecord(accuracy, per_prompt, hits, step_probs, calibrate, settings)
    medusa = [(kind, n) for kind, n in settings if kind != "plain"]
    record.survivals = {(kind, n): prompt_survivals(kind, n, record) for kind, n in medusa}
    record.generations = {(kind, n): prompt_generations(kind, n, record, config) for kind, n in medusa}
    return record


def timed_runs(
    decoder, prompts, config: ValidateConfig, record: AcceptanceRecord, log, between=lambda shares: None
) -> list[dict]:
    """Measured runs of plain decoding and every tree, one row per (tree kind, size).

    Plain decoding and every tree are timed interleaved, batch by batch
    (decoder.runs.decode_interleaved), so machine drift cancels in the speedups;
    `between(shares)` runs after each of the `shares` batches (the operator timings'
    rounds)."""
    kwargs = decode_kwargs(config)
    for setting in record.settings.values():  # warm-up of every shape, untimed
        decoder.generate(prompts[: config.batch], 8, **kwargs, **setting)
    sizes = ", ".join(str(n) for kind, n in record.settings if kind == "static")
    kinds = " and dynamic" if config.dynamic else ""
    log(
        f"timing plain decoding and static{kinds} trees of {sizes} tokens interleaved, "
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
    baseline = results[("plain", 1)]
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


def prompt_survivals(kind: str, size: int, record: AcceptanceRecord) -> list[np.ndarray]:
    """Each prompt's s[d] (perfmodel.acceptance.batching) for one Medusa run: from its head accuracies
    for a static tree, from calibrated per-position probabilities for a dynamic one."""
    if kind == "static":
        return [acceptance_survival(record.settings[kind, size]["tree"], a) for a in record.per_prompt]
    return [dynamic_survival(p, size - 1, record.calibrate) for p in record.step_probs]


def prompt_generations(kind: str, size: int, record: AcceptanceRecord, config: ValidateConfig) -> list[np.ndarray]:
    """Each prompt's tokens after every step (perfmodel.acceptance.batching): a static tree under
    greedy acceptance replayed through the heads' recorded predictions (the decoder's
    steps exactly: greedy verification is deterministic and lossless, so its text is the
    plain pass's); otherwise simulated from the prompt's survival curve."""
    if kind == "static" and record.hits:
        tree = record.settings[kind, size]["tree"]
        return replayed_tokens([accepted_lengths(tree, h) for h in record.hits], config.new_tokens)
    return simulated_tokens(record.survivals[kind, size], config.new_tokens, seed=config.seed)


def predicted_acceptance(kind: str, size: int, record: AcceptanceRecord, config: ValidateConfig) -> tuple[float, float]:
    """(tokens per step of one sequence, tokens per sequence and step of the batch)."""
    if kind == "plain":
        return 1.0, 1.0
    generations = record.generations[kind, size]
    return (
        batch_acceptance(generations, 1, config.new_tokens),
        batch_acceptance(generations, config.batch, config.new_tokens),
    )


def accuracy_acceptance(kind: str, size: int, record: AcceptanceRecord, config: ValidateConfig) -> float:
    """Tokens per sequence and step of the batch from the head accuracies alone, heads
    independent and steps alike (what perfmodel predicts from a checkpoint's accuracies);
    NaN for a dynamic tree, which has no fixed tree to value."""
    if kind != "static":
        return float("nan")
    generations = simulated_tokens(record.survivals[kind, size], config.new_tokens, seed=config.seed)
    return batch_acceptance(generations, config.batch, config.new_tokens)


def step_contexts(record: AcceptanceRecord, config: ValidateConfig) -> dict[tuple[str, int], int]:
    """Cached tokens each run's steps attend to, on average: the mean context for plain
    decoding (every sequence a token a step, so none leads); for a tree, the batch's
    leading sequence's (perfmodel.acceptance.batching.attended_context), which the reference decoder
    pads the others to."""
    return {
        (kind, size): config.context
        if kind == "plain"
        else round(attended_context(record.generations[kind, size], config.batch, config.prompt_len, config.new_tokens))
        for kind, size in record.settings
    }


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


def predicted_phases(step: StepModel, batch: int, contexts, sizes, host_s: float) -> dict[str, np.ndarray]:
    """Predicted seconds per step in each of the decoder's phases (decoder.medusa.STEP_PARTS):
    its operators grouped by the phase that runs them, the host overhead in the forward."""
    phases = {f"predicted_{phase}_s": np.zeros(len(sizes)) for phase in DECODER_PHASE_OPS}
    for op, seconds in step.op_times(batch, np.asarray(contexts), np.asarray(sizes)).items():
        phase = next((p for p, ops in DECODER_PHASE_OPS.items() if op in ops), "forward")
        phases[f"predicted_{phase}_s"] += seconds
    phases["predicted_forward_s"] += host_s
    return phases


def validate(config: ValidateConfig, log=print) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per-tree comparison, measured op rows, summary)."""

    if config.device == "cuda" and not torch.cuda.is_available():
        raise PerfkitError("--device cuda: no CUDA device is visible to torch on this machine; use --device cpu")
    ckpt = load_checkpoint(config.model)
    if ckpt.heads is None:
        raise PerfkitError(f"{ckpt.folder} has no Medusa heads to validate")
    model = load_model(ckpt.folder)
    dtype = "fp32"  # the reference decoder runs checkpoints in fp32
    torch.manual_seed(config.seed)
    decoder = Decoder(ckpt, config.device)
    prompts = heldout_prompts(ckpt, config.prompts, config.prompt_len, config.seed)
    probe_prompts = heldout_prompts(
        ckpt, config.batch, max(1, config.context - PROBE_LEAD - PROBE_STEPS // 2), config.seed + 1
    )
    with torch_threads(config.threads):
        record = acceptance_record(decoder, prompts, config, log)
        contexts = step_contexts(record, config)
        timing = operator_timing(
            StepModel(model, _Nothing(), "reference"), config, dtype, decoder, probe_prompts, contexts, log
        )
        runs = timed_runs(decoder, prompts, config, record, log, between=timing.sample_share)
        rows, plain_step_s = operator_rows(timing)
        build_s = {
            r["tree_size"]: dynamic_build_s(decoder, record.step_probs, r["tree_size"] - 1)
            for r in runs
            if r["tree_kind"] == "dynamic"
        }
    step = StepModel(model, MeasuredLatency(rows, model.name, dtype), "reference")
    sizes = np.array([r["tree_size"] for r in runs])
    attended = np.array([contexts[r["tree_kind"], r["tree_size"]] for r in runs])
    ops_plain = float(step.step_time(config.batch, config.context, 1))
    ops_tree = step.step_time(config.batch, attended, sizes)
    host = plain_step_s - ops_plain
    # a dynamic tree is built on the host for every sequence of every step
    tree_build = np.array([build_s.get(r["tree_size"], 0.0) if r["tree_kind"] == "dynamic" else 0.0 for r in runs])
    tree_build = tree_build * config.batch
    table = pd.DataFrame(runs)
    decoded_plain_step_s = float(table["measured_step_s"].iloc[0])
    acceptance = [predicted_acceptance(r["tree_kind"], r["tree_size"], record, config) for r in runs]
    table["predicted_acceptance"] = [alone for alone, _ in acceptance]
    table["predicted_batch_acceptance"] = [batch for _, batch in acceptance]
    table["measured_batch_acceptance"] = [r["batch_acceptance"] for r in runs]
    table["attended_context"] = attended
    table = table.assign(**predicted_phases(step, config.batch, attended, sizes, host))
    table["predicted_candidates_s"] += tree_build
    table["ops_step_s"] = ops_tree
    table["dynamic_tree_build_s"] = tree_build
    table["predicted_step_s"] = ops_tree + host + tree_build
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
    # Which device and model the comparison describes, so reports can match it to theirs.
    table["device"], table["model"], table["dtype"] = rows["device"].iloc[0], model.name, dtype
    phases = table[[c for c in table.columns if c.endswith("_s") and c.split("_", 1)[1][:-2] in DECODER_PHASE_OPS]]
    phases = phases.assign(tree_kind=table["tree_kind"], tree_size=sizes)
    table = table[table["tree_kind"] != "plain"].reset_index(drop=True)
    summary = {
        "threads": config.threads,
        "plain_step_s": plain_step_s,
        "decoded_plain_step_s": decoded_plain_step_s,
        "ops_plain_step_s": ops_plain,
        "host_overhead_s": host,
        "max_abs_error": float(table["error"].abs().max()),
        "within_target": bool((table["error"].abs() <= TARGET_ERROR).all()),
        "phases": phases,
    }
    columns = [
        "device",
        "model",
        "dtype",
        "acceptance_scheme",
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
        "lossless",
        *[c for c in phases.columns if c.endswith("_s")],
    ]
    return table[columns], rows, summary


def phase_table(phases: pd.DataFrame) -> pd.DataFrame:
    """One 'measured / predicted' ms column per decoder phase, one row per tree size."""
    out = pd.DataFrame({"tree": phases["tree_kind"], "tree_size": phases["tree_size"]})
    for phase in DECODER_PHASE_OPS:
        out[phase] = [
            f"{m * 1e3:.2f} / {p * 1e3:.2f}"
            for m, p in zip(phases[f"measured_{phase}_s"], phases[f"predicted_{phase}_s"])
        ]
    return out


def dynamic_against_static(table: pd.DataFrame) -> pd.DataFrame:
    """Per node count: the dynamic tree's measured and predicted speedup over the static
    tree's, and what building it costs per step."""
    key = ["batch", "tree_size"]
    static = table[table["tree_kind"] == "static"].set_index(key)
    dynamic = table[table["tree_kind"] == "dynamic"].set_index(key)
    out = pd.DataFrame(
        {
            "measured_dynamic_over_static": dynamic["measured_speedup"] / static["measured_speedup"],
            "predicted_dynamic_over_static": dynamic["predicted_speedup"] / static["predicted_speedup"],
            "measured_acceptance_gain": dynamic["measured_batch_acceptance"] / static["measured_batch_acceptance"],
            "measured_extra_step_ms": (dynamic["measured_step_s"] - static["measured_step_s"]) * 1e3,
            "tree_build_ms": dynamic["dynamic_tree_build_s"] * 1e3,
        }
    )
    return out.reset_index()


@contextmanager
def torch_threads(count: int):
    """torch's intra-op thread count set for a block, and restored after it."""

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Nothing:
    """A latency source for listing a step's op calls, never asked for a time."""

    def op_time(self, *args):
        raise AssertionError("not for timing")


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.validate", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the decoder and the operators run (default %(default)s)",
    )
    p.add_argument(
        "--model",
        default="bundled",
        metavar="DIR|bundled",
        help="checkpoint with Medusa heads (default: the bundled model)",
    )
    p.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        default=list(DEFAULT_SIZES),
        metavar="N",
        help="tree sizes, root included (default 2 4 8 16 32 64)",
    )
    p.add_argument(
        "--batch",
        type=batch_size,
        nargs="+",
        default=[1],
        metavar="B",
        help="prompts decoded together; several batch sizes run one closed loop each (default %(default)s)",
    )
    p.add_argument("--prompts", type=positive_int, default=16, help="held-out prompts (default %(default)s)")
    p.add_argument(
        "--prompt-len",
        type=positive_int,
        default=64,
        metavar="L",
        help="prompt tokens per held-out prompt (default %(default)s)",
    )
    p.add_argument(
        "--new-tokens",
        type=positive_int,
        default=96,
        metavar="T",
        help="tokens generated per prompt (default %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="CPU threads for decoding and operator timing (default %(default)s: see README)",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=None,
        help="interleaved timing passes over the prompts (default: enough for every setting to decode "
        f"{MIN_TIMED_BATCHES} batches of prompts, and 2 at least)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.3,
        metavar="SECONDS",
        help="timer budget per operator point (default %(default)s)",
    )
    p.add_argument(
        "--flush",
        choices=FLUSH_MODES,
        default="none",
        help="cache state of the operator timings: none = warm (default), model = flush the model's size, all = "
        "evict the last-level cache",
    )
    p.add_argument(
        "--acceptance",
        choices=VALIDATED_SCHEMES,
        default="greedy",
        help="acceptance scheme of every Medusa run; typical is predicted from its own record (default %(default)s)",
    )
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="also run the dynamic tree (built each step from the heads' probabilities) of every size",
    )
    p.add_argument("--csv", type=Path, metavar="FILE", help="write the per-tree comparison here")
    p.add_argument("--ops-csv", type=Path, metavar="FILE", help="write the measured operator rows here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    tables, all_rows = [], []
    for batch in dict.fromkeys(args.batch):
        config = ValidateConfig(
            device=args.device,
            model=args.model,
            sizes=tuple(args.sizes),
            batch=batch,
            prompts=args.prompts,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            budget_s=args.budget,
            rounds=args.rounds,
            flush=args.flush,
            threads=args.threads,
            acceptance=args.acceptance,
            dynamic=args.dynamic,
        )
        log(f"--- batch {batch}")
        table, rows, summary = validate(config, log)
        tables.append(table)
        all_rows.append(rows.assign(closed_loop_batch=batch))
        print(f"batch {batch}:")
        print_batch(table, summary)
    table = pd.concat(tables, ignore_index=True)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.csv, index=False)
    if args.ops_csv:
        write_table(pd.concat(all_rows, ignore_index=True), args.ops_csv)
    worst = table.loc[table["error"].abs().idxmax()]
    within = bool((table["error"].abs() <= TARGET_ERROR).all())
    print(
        f"max |predicted - measured| / measured over every batch and tree size = {abs(worst['error']) * 100:.1f}% "
        f"(batch {worst['batch']}, {worst['tree_kind']} tree {worst['tree_size']}; "
        f"{'within' if within else 'NOT within'} the "
        f"{TARGET_ERROR:.0%} target); {time.perf_counter() - started:.0f} s"
    )
    if args.csv:
        print(f"wrote {args.csv}")
    return 0


# The two plain-step measurements (beside the operators; in the decoding runs) share the
# machine's state, so beyond this they disagree because the machine changed under them.
PLAIN_STEP_AGREEMENT = 0.10


def calibration_notes(summary: dict) -> list[str]:
    """What a user should know about the calibration behind one batch's predictions."""
    notes = []
    plain, ops = summary["plain_step_s"], summary["ops_plain_step_s"]
    if summary["host_overhead_s"] < 0:
        notes.append(
            f"note: the plain step's operators add up to {ops / plain - 1:.0%} more than the step itself: each is "
            "timed after unrelated ones, in a random order, and finds colder caches than in the step; the "
            "negative host overhead carries that correction into every tree step"
        )
    drift = summary["decoded_plain_step_s"] / plain - 1
    if abs(drift) > PLAIN_STEP_AGREEMENT:
        notes.append(
            f"warning: the plain step timed beside the operators and in the decoding runs differ by {drift:+.0%}; "
            "the machine's speed changed during the run (something else running?): rerun on an idle machine"
        )
    return notes


def print_batch(table: pd.DataFrame, summary: dict) -> None:
    shown = table.assign(
        predicted_step_ms=table["predicted_step_s"] * 1e3,
        measured_step_ms=table["measured_step_s"] * 1e3,
        error_pct=table["error"] * 100,
        accuracy_error_pct=table["accuracy_error"] * 100,
    )[
        [
            "tree_kind",
            "tree_size",
            "predicted_acceptance",
            "measured_acceptance",
            "predicted_batch_acceptance",
            "measured_batch_acceptance",
            "predicted_step_ms",
            "measured_step_ms",
            "predicted_speedup",
            "measured_speedup",
            "error_pct",
            "accuracy_error_pct",
            "lossless",
        ]
    ]
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(
        "where a step's time goes, ms per step (measured in the decoding runs / predicted from the operators; tree "
        "size 1 is plain decoding):"
    )
    print(phase_table(summary["phases"]).to_string(index=False))
    if (table["tree_kind"] == "dynamic").any():
        print(dynamic_against_static(table).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(
        f"{summary['threads']} CPU thread(s); plain step: {summary['plain_step_s'] * 1e3:.2f} ms timed with the "
        "operators "
        f"({summary['decoded_plain_step_s'] * 1e3:.2f} ms in the decoding runs), its operators "
        f"{summary['ops_plain_step_s'] * 1e3:.2f} ms, "
        f"host overhead {summary['host_overhead_s'] * 1e3:.2f} ms per step (calibrated on plain decoding only)"
    )
    for line in calibration_notes(summary):
        print(line)
    print()


if __name__ == "__main__":
    sys.exit(run(main))
