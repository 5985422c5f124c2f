"""python -m decoder.ablation: the Medusa paper's Fig. 4 on a real model and this machine.

(a) the acceleration rate (tokens per step) against the number of candidates, for randomly
sampled dense trees (each head's top-s_d under every node of the level above, the
Cartesian product) and for the paper's greedy sparse trees; (b) the wall speedup of the
same trees over plain decoding on this machine.

Every tree is measured: held-out prompts decoded plainly and with each tree in turn, batch
by batch (decoder.runs.decode_interleaved), greedy acceptance. Every tree is also
predicted by the performance model: its tokens per step from the heads' top-k accuracies
on a first plain pass (each prompt's own, perfmodel.acceptance.batching), its step time from a
separate calibration of this decoder's steps by tree size (decoder.tree_calibration.calibrate,
interpolated in the number of tokens), never from the runs it is compared with.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from decoder.acceptance import AcceptanceConfig
from decoder.checkpoint import load_checkpoint
from decoder.measure import head_accuracy
from decoder.medusa import Decoder
from decoder.runs import decode_batches, decode_interleaved, heldout_prompts, mean_accepted
from decoder.tree import Drafting
from decoder.tree_calibration import calibrate
from perfmodel.acceptance.ablation import dense_against_sparse
from perfmodel.acceptance.batching import acceptance_survival, batch_acceptance, simulated_tokens
from perfmodel.acceptance.trees import dense_tree, greedy_tree, random_dense_settings
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, batch_size, options, positive_int, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.hardware.cpu_identity import this_cpu_key
from perfmodel.models.config import load_model
from perfmodel.models.operators import HEAD_TOP_K

SPARSE_NODES = (4, 8, 16, 24, 32, 48, 64, 96, 128)
# Where the step time is calibrated; a tree of any other size is priced by interpolation.
STEP_SIZES = (1, 2, 5, 9, 17, 33, 65, 97, 129)
COLUMNS = (
    "device",
    "model",
    "kind",
    "setting",
    "nodes",
    "tree_size",
    "depth",
    "predicted_acceptance",
    "measured_acceptance",
    "acceptance_error",
    "predicted_step_s",
    "measured_step_s",
    "predicted_speedup",
    "measured_speedup",
    "speedup_error",
    "batch",
    "prompts",
    "prompt_len",
    "new_tokens",
    "threads",
    "paths",
)


@dataclass(frozen=True)
class AblationConfig:
    model: str = "bundled"
    dense: int = 12  # random dense trees
    sparse_nodes: tuple[int, ...] = SPARSE_NODES
    max_nodes: int = 128
    batch: int = 1
    prompts: int = 16
    prompt_len: int = 64
    new_tokens: int = 96
    rounds: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_nodes < 1 or any(n < 1 or n > self.max_nodes for n in self.sparse_nodes):
            raise PerfkitError(
                f"sparse trees need 1 to max_nodes ({self.max_nodes}) nodes; got {list(self.sparse_nodes)}"
            )
        if self.max_nodes + 1 > STEP_SIZES[-1]:
            raise PerfkitError(f"max_nodes is at most {STEP_SIZES[-1] - 1} (the step time is calibrated up to there)")


def ablation_trees(config: AblationConfig, accuracy: np.ndarray) -> dict[tuple[str, str], object]:
    """(kind, setting) -> Tree: the random dense trees, then the greedy sparse ones."""
    heads = accuracy.shape[0]
    trees = {}
    for setting in random_dense_settings(config.dense, heads, HEAD_TOP_K, config.max_nodes, config.seed):
        trees[("dense", "top-" + "x".join(map(str, setting)))] = dense_tree(setting)
    for nodes in config.sparse_nodes:
        trees[("sparse", f"greedy-{nodes}")] = greedy_tree(accuracy, nodes)
    return trees


def ablation(config: AblationConfig, log=print) -> pd.DataFrame:
    ckpt = load_checkpoint(config.model)
    if ckpt.heads is None:
        raise PerfkitError(f"{ckpt.folder} has no Medusa heads to build trees from")
    torch.manual_seed(config.seed)
    decoder = Decoder(ckpt)
    kwargs = dict(acceptance=AcceptanceConfig("greedy"))
    prompts = heldout_prompts(ckpt, config.prompts, config.prompt_len, config.seed)
    decoder.generate(prompts[: config.batch], 8, **kwargs)  # warm-up, not timed
    log(f"plain decoding of {len(prompts)} held-out prompts for the heads' accuracies ...")
    outputs = decode_batches(decoder, prompts, config.batch, config.new_tokens, **kwargs).tokens
    accuracy = head_accuracy(decoder, prompts, outputs)
    per_prompt = [head_accuracy(decoder, [p], [o]) for p, o in zip(prompts, outputs)]
    trees = ablation_trees(config, accuracy)

    context = config.prompt_len + config.new_tokens // 2
    largest = max(tree.size for tree in trees.values())
    step_sizes = [n for n in STEP_SIZES if n < largest] + [largest]
    step_s = calibrate(decoder, ckpt, config.batch, context, config.new_tokens, accuracy, log, sizes=step_sizes)[
        "step_s"
    ]
    sizes = np.array(sorted(step_s))
    predicted_step = lambda n: float(np.interp(n, sizes, [step_s[s] for s in sizes]))  # noqa: E731

    settings = {"plain": {}} | {key: {"drafting": Drafting(tree)} for key, tree in trees.items()}
    chunks = -(-len(prompts) // config.batch) * config.rounds
    log(f"decoding with plain decoding and {len(trees)} trees in turn, {config.rounds} round(s) ...")
    with tqdm(total=chunks, desc="trees", unit="batch", disable=None, file=sys.stderr) as bar:
        runs = decode_interleaved(
            decoder, prompts, config.batch, config.new_tokens, settings, config.rounds, progress=bar.update, **kwargs
        )
    plain = runs["plain"]
    rows = []
    for (kind, setting), tree in trees.items():
        result = runs[(kind, setting)]
        survivals = [acceptance_survival(tree, a) for a in per_prompt]
        generations = simulated_tokens(survivals, config.new_tokens, seed=config.seed)
        acceptance = batch_acceptance(generations, config.batch, config.new_tokens)
        step = predicted_step(tree.size)
        rows.append(
            {
                "kind": kind,
                "setting": setting,
                "nodes": tree.size - 1,
                "tree_size": tree.size,
                "depth": tree.depth,
                "predicted_acceptance": acceptance,
                "measured_acceptance": mean_accepted(result),
                "predicted_step_s": step,
                "measured_step_s": result.decode_s / result.steps,
                "predicted_speedup": acceptance * predicted_step(1) / step,
                "measured_speedup": result.tokens_per_s / plain.tokens_per_s,
                "paths": json.dumps([list(p) for p in tree.paths]),
            }
        )
    table = pd.DataFrame(rows)
    table["acceptance_error"] = table["predicted_acceptance"] / table["measured_acceptance"] - 1
    table["speedup_error"] = table["predicted_speedup"] / table["measured_speedup"] - 1
    table = table.assign(
        device=this_cpu_key(),
        model=load_model(ckpt.folder).name,
        batch=config.batch,
        prompts=config.prompts,
        prompt_len=config.prompt_len,
        new_tokens=config.new_tokens,
        threads=torch.get_num_threads(),
    )
    return table[list(COLUMNS)].sort_values(["kind", "nodes"]).reset_index(drop=True)


@dataclass(frozen=True)
class AblationOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    model: str = field(default="bundled", metadata=shared(options.model, needs_weights=True))
    dense: int = field(
        default=12,
        metadata=option("--dense", "random dense trees (default %(default)s)", type=positive_int, metavar="N"),
    )
    sparse_nodes: tuple[int, ...] = field(
        default=tuple(SPARSE_NODES),
        metadata=option(
            "--sparse-nodes",
            "node counts of the greedy sparse trees (default 4 8 16 24 32 48 64 96 128)",
            type=positive_int,
            nargs="+",
            metavar="N",
        ),
    )
    max_nodes: int = field(
        default=128,
        metadata=option(
            "--max-nodes", "largest dense tree, in nodes (default %(default)s)", type=positive_int, metavar="N"
        ),
    )
    batch: int = field(
        default=1,
        metadata=option("--batch", "prompts decoded together (default 1)", type=batch_size, metavar="B"),
    )
    prompts: int = field(
        default=16, metadata=option("--prompts", "held-out prompts (default %(default)s)", type=positive_int)
    )
    prompt_len: int = field(
        default=64, metadata=option("--prompt-len", "tokens per prompt (default %(default)s)", type=positive_int)
    )
    new_tokens: int = field(
        default=96, metadata=option("--new-tokens", "tokens per prompt (default %(default)s)", type=positive_int)
    )
    rounds: int = field(
        default=1, metadata=option("--rounds", "passes over the prompts (default %(default)s)", type=positive_int)
    )
    seed: int = field(
        default=0,
        metadata=option("--seed", "dense trees and prompts (default %(default)s)", type=int, metavar="N"),
    )
    csv: Path = field(default=None, metadata=shared(options.csv, what="the table", required=True))


def build_parser() -> Parser:
    p = Parser(prog="python -m decoder.ablation", description=__doc__.split("\n\n")[0])
    add_options(p, AblationOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(AblationOptions, build_parser().parse_args(argv))
    started = time.perf_counter()
    config = AblationConfig(
        model=args.model,
        dense=args.dense,
        sparse_nodes=tuple(args.sparse_nodes),
        max_nodes=args.max_nodes,
        batch=args.batch,
        prompts=args.prompts,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        rounds=args.rounds,
        seed=args.seed,
    )
    table = ablation(config, log=lambda text: print(text, file=sys.stderr, flush=True))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    write_csv(table, args.csv)
    shown = table.drop(columns=["paths", "device", "model", "batch", "prompts", "prompt_len", "new_tokens", "threads"])
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("\ndense trees against the sparse curve at the same number of candidates (measured):")
    print(dense_against_sparse(table).to_string(index=False, float_format=lambda x: f"{x:+.1%}"))
    print(
        f"\nprediction error, max |predicted - measured| / measured: tokens per step "
        f"{table['acceptance_error'].abs().max():.1%}, speedup {table['speedup_error'].abs().max():.1%}"
    )
    print(f"wrote {args.csv} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
