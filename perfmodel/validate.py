"""python -m perfmodel.validate: predict the Medusa speedup, then run the decoder and compare.

The closed loop, on this machine and the bundled model (or any checkpoint):
1. plain decoding of held-out prompts: the baseline step time, and the heads' top-k
   accuracies a_k^(i) measured on its output;
2. operator latencies: every op of the reference decoder's step (perfmodel.step,
   flavor `reference`) timed by the profilers at the run's batch, mean context and each
   tree size, the cache flushed by about the model's size between calls, as the rest of a
   real step would;
3. prediction per tree size n: acceptance of the greedy n-token tree from the measured
   accuracies (perfmodel.trees), step time = sum of the op latencies + the host overhead,
   speedup = acceptance / (step(n) / step(1)). The host overhead (Python, module calls,
   framework dispatch between the ops) is the one calibrated constant: the plain step's
   measured time minus its ops, taken from the baseline run, never from a Medusa run;
4. Medusa decoding with each tree: measured tokens per step and speedup; the error.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.calibration import MeasuredLatency
from perfmodel.cli import Parser, positive_int, run
from perfmodel.errors import PerfkitError
from perfmodel.step import StepModel

DEFAULT_SIZES = (2, 4, 8, 16, 32, 64)
TARGET_ERROR = 0.10
# none: ops timed back to back, warm (a small model stays in a CPU's cache through a step);
# model: the cache flushed by the model's weight bytes between calls; all: evict everything
# (the paper's method for a 7B model on a GPU, whose weights never fit in L2).
FLUSH_MODES = ("none", "model", "all")


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
    flush: str = "none"  # cache state of the operator timings: none (warm), model, all
    seed: int = 0

    def __post_init__(self) -> None:
        if self.flush not in FLUSH_MODES:
            raise PerfkitError(f"flush must be one of {', '.join(FLUSH_MODES)}, got {self.flush!r}")
        if self.device not in ("cpu", "cuda"):
            raise PerfkitError(f"device must be cpu or cuda, got {self.device!r}")
        bad = [s for s in self.sizes if s < 2]
        if bad or not self.sizes:
            raise PerfkitError(f"tree sizes are tokens per step with the root, so >= 2; got {list(self.sizes)}")

    @property
    def context(self) -> int:
        """Mean tokens in the cache over a generation: prompt plus half the response."""
        return self.prompt_len + self.new_tokens // 2


def measure_ops(step: StepModel, config: ValidateConfig, dtype: str, log) -> pd.DataFrame:
    """Measured data-contract rows for every op call of the plain and tree steps."""
    import dataclasses

    from profilers.device import cpu_info, cuda_info
    from profilers.sweep import SweepConfig, Sweeper, default_timer
    from perfmodel.grid import QUICK_GRID

    info, nvml = (cpu_info(), None) if config.device == "cpu" else cuda_info()
    timer = default_timer(config.device, config.budget_s)
    if config.flush == "none":
        timer = dataclasses.replace(timer, flush_cache=False)
    elif config.flush == "model":
        timer = dataclasses.replace(timer, flush_bytes=sum(p.numel() * p.element_size() for p in _weights_of(config.model)))
    sweeper = Sweeper(SweepConfig(config.device, step.model, dtype, QUICK_GRID, Path("unused.csv"), timer=timer), info, nvml)
    points = {}
    sizes = np.array((1, *config.sizes))
    for item, phase, b, s, q, _ in step.calls(config.batch, config.context, sizes):
        for point in zip(b.tolist(), s.tolist(), q.tolist()):
            points.setdefault((item.op, phase, *point), None)
    log(f"timing {len(points)} operator points of the {step.model.name} step on {info.name} ...")
    rows = []
    for op, phase, b, s, q in points:
        row = sweeper.measure(op, phase, b, s, q, run_id="validate")
        if row["status"] != "ok":
            raise PerfkitError(f"could not time {op}/{phase} at batch {b}, seq {s}, candidates {q}: {row['reason']}")
        rows.append(row)
    return pd.DataFrame(rows)


def _weights_of(model: str):
    from decoder.checkpoint import load_checkpoint

    ckpt = load_checkpoint(model)
    return list(ckpt.model.parameters())


def run_decoder(config: ValidateConfig, log):
    """Baseline and Medusa runs: measured step times, tokens per step, head accuracies."""
    import torch

    from decoder.checkpoint import load_checkpoint
    from decoder.measure import TOPK, decode_batches, head_accuracy, heldout_prompts, mean_accepted
    from decoder.medusa import Decoder
    from perfmodel.trees import greedy_tree

    ckpt = load_checkpoint(config.model)
    if ckpt.heads is None:
        raise PerfkitError(f"{ckpt.folder} has no Medusa heads to validate")
    torch.manual_seed(config.seed)
    decoder = Decoder(ckpt, config.device)
    prompts = heldout_prompts(ckpt, config.prompts, config.prompt_len, config.seed)
    kwargs = dict(topk=TOPK)
    decoder.generate(prompts[: config.batch], 8, **kwargs)  # warm-up, untimed
    log(f"plain decoding of {len(prompts)} held-out prompts ...")
    baseline = decode_batches(decoder, prompts, config.batch, config.new_tokens, **kwargs)
    accuracy = head_accuracy(decoder, prompts, baseline.tokens)
    runs = []
    for size in config.sizes:
        tree = greedy_tree(accuracy, size - 1)
        decoder.generate(prompts[: config.batch], 8, tree=tree, **kwargs)
        log(f"Medusa decoding with the greedy {size}-token tree ...")
        result = decode_batches(decoder, prompts, config.batch, config.new_tokens, tree=tree, **kwargs)
        runs.append(
            {
                "tree_size": size,
                "tree": tree,
                "measured_acceptance": mean_accepted(result),
                "measured_step_s": result.decode_s / result.steps,
                "measured_speedup": result.tokens_per_s / baseline.tokens_per_s,
                "lossless": result.tokens == baseline.tokens,
            }
        )
    return baseline.decode_s / baseline.steps, accuracy, runs


def validate(config: ValidateConfig, log=print) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per-tree comparison, measured op rows, summary)."""
    from perfmodel.models import load_model
    from perfmodel.trees import expected_acceptance
    from decoder.checkpoint import resolve_folder

    if config.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise PerfkitError("--device cuda: no CUDA device is visible to torch on this machine; use --device cpu")
    model = load_model(resolve_folder(config.model))
    dtype = "fp32"  # the reference decoder runs checkpoints in fp32
    plain_step_s, accuracy, runs = run_decoder(config, log)
    rows = measure_ops(StepModel(model, _Nothing(), "reference"), config, dtype, log)
    step = StepModel(model, MeasuredLatency(rows, model.name, dtype), "reference")
    sizes = np.array([r["tree_size"] for r in runs])
    ops_plain = float(step.step_time(config.batch, config.context, 1))
    ops_tree = step.step_time(config.batch, config.context, sizes)
    host = plain_step_s - ops_plain
    table = pd.DataFrame(runs).drop(columns="tree")
    table["predicted_acceptance"] = [expected_acceptance(r["tree"], accuracy) for r in runs]
    table["ops_step_s"] = ops_tree
    table["predicted_step_s"] = ops_tree + host
    table["predicted_speedup"] = table["predicted_acceptance"] / (table["predicted_step_s"] / plain_step_s)
    table["ops_only_speedup"] = table["predicted_acceptance"] / (ops_tree / ops_plain)
    table["error"] = (table["predicted_speedup"] - table["measured_speedup"]) / table["measured_speedup"]
    table["batch"], table["context"] = config.batch, config.context
    summary = {
        "plain_step_s": plain_step_s,
        "ops_plain_step_s": ops_plain,
        "host_overhead_s": host,
        "max_abs_error": float(table["error"].abs().max()),
        "within_target": bool((table["error"].abs() <= TARGET_ERROR).all()),
    }
    columns = [
        "tree_size", "batch", "context", "predicted_acceptance", "measured_acceptance", "predicted_step_s", "measured_step_s",
        "ops_step_s", "predicted_speedup", "measured_speedup", "error", "ops_only_speedup", "lossless",
    ]  # fmt: skip
    return table[columns], rows, summary


class _Nothing:
    """A latency source for listing a step's op calls, never asked for a time."""

    def op_time(self, *args):
        raise AssertionError("not for timing")


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model", default="bundled", metavar="DIR|bundled", help="checkpoint with Medusa heads (default: the bundled model)")
    p.add_argument("--sizes", type=positive_int, nargs="+", default=list(DEFAULT_SIZES), metavar="N", help="tree sizes, root included (default 2 4 8 16 32 64)")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--prompts", type=positive_int, default=16, help="held-out prompts (default %(default)s)")
    p.add_argument("--prompt-len", type=positive_int, default=64)
    p.add_argument("--new-tokens", type=positive_int, default=96)
    p.add_argument("--budget", type=float, default=0.3, metavar="SECONDS", help="timer budget per operator point (default %(default)s)")
    p.add_argument("--flush", choices=FLUSH_MODES, default="none", help="cache state of the operator timings: none = warm (default), model = flush the model's size, all = evict the last-level cache")
    p.add_argument("--csv", type=Path, metavar="FILE", help="write the per-tree comparison here")
    p.add_argument("--ops-csv", type=Path, metavar="FILE", help="write the measured operator rows here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = ValidateConfig(args.device, args.model, tuple(args.sizes), args.batch, args.prompts, args.prompt_len, args.new_tokens, args.budget, args.flush)
    started = time.perf_counter()
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    table, rows, summary = validate(config, log)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.csv, index=False)
    if args.ops_csv:
        from perfmodel.contract import write_table

        write_table(rows, args.ops_csv)
    shown = table.assign(
        predicted_step_ms=table["predicted_step_s"] * 1e3, measured_step_ms=table["measured_step_s"] * 1e3, error_pct=table["error"] * 100
    )[["tree_size", "predicted_acceptance", "measured_acceptance", "predicted_step_ms", "measured_step_ms", "predicted_speedup", "measured_speedup", "error_pct", "lossless"]]
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(
        f"plain step: measured {summary['plain_step_s'] * 1e3:.2f} ms, its operators {summary['ops_plain_step_s'] * 1e3:.2f} ms, "
        f"host overhead {summary['host_overhead_s'] * 1e3:.2f} ms per step (calibrated on plain decoding only)"
    )
    if summary["host_overhead_s"] < 0:
        print("warning: the plain step's operators, timed apart, take longer than the measured step itself; "
              "the machine was probably busy during the operator timing: rerun on an idle machine")
    verdict = "within" if summary["within_target"] else "NOT within"
    print(f"max |predicted - measured| / measured = {summary['max_abs_error'] * 100:.1f}% ({verdict} the {TARGET_ERROR:.0%} target); {time.perf_counter() - started:.0f} s")
    if args.csv:
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
