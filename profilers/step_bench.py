"""python -m profilers.step_bench: what the host does per decoding step, eager against static.

For each launch regime (perfmodel.base.launch) and batch, the reference decoder decodes
random prompts with a Medusa tree, replaying a fixed accepted length so that every regime
and batch runs the same number of steps, and the command prints per step:

- kernels launched: every operator that runs a kernel (views and allocations aside);
- python ms: the step's wall time outside those operators: the Python that builds and
  issues them and reads results back, timed by a dispatch mode around every operator;
- operator ms: the time inside them (on a CPU, dispatch and the kernel itself).

Each is the median over every step of --rounds runs (a step runs from one step's tokens
reaching the host to the next's, so prefill is left out; a step slowed by another job on a
busy machine is outvoted). The model is --model's
depth, heads and tree with widths of 64, so that kernels stay small (`--as-configured`: at
its own widths). On a GPU the host's time per step is its Python plus one dispatch per
kernel (profilers.host_dispatch measures that cost): a step whose kernels take less is
host-bound. The Python column includes the dispatch mode's own cost per operator, the same
for every regime.

The eager decoder loops over the sequences of the batch in acceptance and commit, so its
launches and host time grow with the batch; the static step's stay flat.

    python -m profilers.step_bench --batch 1 2 4 8 16 --tree-size 16
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from decoder.medusa import Decoder
from decoder.model import LlamaConfig
from decoder.trace_ops import NO_KERNEL
from decoder.trace_run import llama_config, step_tree
from decoder.tree import Drafting
from decoder.twin import Replay, dummy_checkpoint_of, random_prompts
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.models.config import load_model
from perfmodel.models.operators import HEAD_TOP_K
from profilers.device import check_device

NARROW = 64  # hidden size of the narrow model whose kernels cost next to nothing
PROMPT_LEN = 16
STEPS = 12  # steps of each timed run


def narrow(config: LlamaConfig) -> LlamaConfig:
    """`config`'s depth, heads and vocabulary shape with widths of NARROW: the same kernels
    launched in the same order, each on a few kilobytes."""
    heads = config.num_attention_heads
    return dataclasses.replace(
        config,
        hidden_size=NARROW,
        intermediate_size=2 * NARROW,
        head_dim=max(2, NARROW // heads),
        vocab_size=min(config.vocab_size, 4 * NARROW),
    )


class OpClock(TorchDispatchMode):
    """Kernels launched and seconds spent inside operators, over whatever runs under it."""

    def __init__(self):
        super().__init__()
        self.kernels, self.inside_s = 0, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        started = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.inside_s += time.perf_counter() - started
        self.kernels += func.overloadpacket.__name__ not in NO_KERNEL
        return out


@dataclass
class Point:
    """One regime at one batch, decoded with a replayed accepted length per step."""

    decoder: Decoder
    batch: int
    tree: object
    launch: Launch
    accepted: int

    def steps(self, steps: int) -> np.ndarray:
        """(steps - 1, 3): per step of a decode, its Python seconds, its seconds inside
        operators and its kernels, from one step's tokens reaching the host to the next's."""
        prompts = random_prompts(self.decoder.model.config.vocab_size, self.batch, PROMPT_LEN, seed=self.batch)
        replay = Replay([[self.accepted]] * self.batch)
        marks = []
        with OpClock() as clock:

            def mark(row: int, _tokens) -> None:
                if row == 0:
                    marks.append((time.perf_counter(), clock.inside_s, clock.kernels))

            self.decoder.generate(
                prompts, steps * self.accepted, Drafting(self.tree), replay=replay, launch=self.launch, on_tokens=mark
            )
        wall, inside, kernels = np.diff(np.array(marks), axis=0).T
        return np.stack([wall - inside, inside, kernels], axis=1)


def measure(points: list[Point], rounds: int) -> pd.DataFrame:
    """Per step of every point: kernels, Python ms and operator ms (the module doc), the
    median over every step of `rounds` runs that go round the points in turn, so that every
    point meets the same machine and a step slowed by another job is outvoted."""
    for point in points:
        point.steps(2)  # warm-up: the static step is built once
    taken = {i: [] for i in range(len(points))}
    for _ in range(rounds):
        for i, point in enumerate(points):
            taken[i].append(point.steps(STEPS))
    rows = []
    for i, point in enumerate(points):
        python, inside, kernels = np.median(np.concatenate(taken[i]), axis=0)
        rows.append(
            {
                "launch": str(point.launch),
                "batch": point.batch,
                "tree_size": point.tree.size,
                "kernels_per_step": kernels,
                "python_ms_per_step": python * 1e3,
                "operator_ms_per_step": inside * 1e3,
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class StepBenchOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    batch: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 16],
        metadata=option("--batch", "batches", type=int, nargs="+", metavar="B"),
    )
    tree_size: int = field(
        default=16, metadata=option("--tree-size", "tokens of the Medusa tree (default 16)", type=int, metavar="T")
    )
    launch: list[str] = field(
        default_factory=lambda: [Launch.EAGER.value, Launch.STATIC.value],
        metadata=shared(options.launch, many=True, default=(Launch.EAGER.value, Launch.STATIC.value)),
    )
    model: str = field(default="bundled", metadata=shared(options.model, needs_weights=True))
    as_configured: bool = field(
        default=False,
        metadata=option(
            "--as-configured",
            "run the model at its own widths, kernels and all (default: its depth, heads and tree at widths of "
            f"{NARROW}, so that kernels stay small)",
            action="store_true",
        ),
    )
    rounds: int = field(
        default=3, metadata=option("--rounds", "timed runs per point (default 3)", type=int, metavar="N")
    )
    threads: int = field(
        default=1, metadata=option("--threads", "torch threads on a CPU (default 1)", type=int, metavar="N")
    )
    device: str = field(default="cpu", metadata=shared(options.device, default="cpu", default_said="cpu"))
    csv: Path | None = field(default=None, metadata=shared(options.csv, what="the table"))


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.step_bench", description=__doc__.split("\n\n")[0])
    add_options(p, StepBenchOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(StepBenchOptions, build_parser().parse_args(argv))
    for name in ("tree_size", "rounds", "threads"):
        if getattr(args, name) < 1:
            raise PerfkitError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(b < 1 for b in args.batch):
        raise PerfkitError(f"--batch must be >= 1, got {min(args.batch)}")
    config = llama_config(load_model(args.model))
    if not args.as_configured:
        config = narrow(config)
    check_device(args.device)
    torch.set_num_threads(args.threads)
    checkpoint = dummy_checkpoint_of(config, device=args.device)
    decoder = Decoder(checkpoint, args.device)
    tree = step_tree(args.tree_size, len(checkpoint.heads), HEAD_TOP_K)
    accepted = min(2, tree.depth + 1)
    points = [
        Point(decoder, batch, tree, launch, accepted)
        for launch in map(Launch.parse, args.launch)
        for batch in args.batch
    ]
    table = measure(points, args.rounds)
    what = "as configured" if args.as_configured else f"narrowed to hidden {NARROW}"
    print(
        f"{args.model} ({what}), {config.num_hidden_layers} layers, tree of {tree.size} tokens, "
        f"{accepted} tokens accepted per step (replayed), {args.device}, {args.threads} thread(s), "
        f"torch {torch.__version__}"
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    for launch, rows_of in table.groupby("launch", sort=False):
        first, last = rows_of.iloc[0], rows_of.iloc[-1]
        kernels = last.kernels_per_step / first.kernels_per_step
        python = last.python_ms_per_step / first.python_ms_per_step
        print(
            f"{launch}: batch {first.batch} -> {last.batch}: kernels per step x{kernels:.2f}, python ms x{python:.2f}"
        )
    if args.csv is not None:
        write_csv(table, args.csv)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
