"""python -m decoder.measure: real acceptance rates of Medusa heads, and real speedups.

Decodes held-out prompts (the 5% of the standard library never trained on) twice, with
plain decoding and with Medusa, and records what the performance model needs: tokens
accepted per step, how often each head's rank-i guess is right (a_k^(i)), acceptance at
several tree sizes, tokens per second both ways, where a Medusa step spends its time, and
whether greedy Medusa reproduced greedy decoding exactly.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from decoder.acceptance import SCHEMES, AcceptanceConfig
from decoder.checkpoint import Checkpoint, load_checkpoint
from decoder.corpus import sample_prompts, split_corpus
from decoder.heads import topk_accuracy
from decoder.medusa import STEP_PARTS, Decoder, DecodeResult
from decoder.tree import TREE_NAMES, resolve_tree
from perfmodel.cli import Parser, positive_int, run
from perfmodel.errors import PerfkitError
from perfmodel.trees import HEAD_TOP_K, expected_acceptance, greedy_tree

DEFAULT_SIZES = (1, 4, 16, 64)  # plus the measured tree's own size


def heldout_prompts(ckpt: Checkpoint, count: int, length: int, seed: int) -> list[list[int]]:
    if ckpt.tokenizer is None:
        raise PerfkitError(f"{ckpt.folder} has no tokenizer.json, needed to encode the held-out prompts")
    _, heldout, _ = split_corpus()
    documents = [e.ids for e in ckpt.tokenizer.encode_batch(heldout)]
    return sample_prompts(documents, count, length, seed)


def decode_batches(decoder: Decoder, prompts, batch: int, max_new: int, **kwargs) -> DecodeResult:
    """Decode the prompts `batch` at a time; one result with everything concatenated."""
    total = DecodeResult([], [], [])
    for start in range(0, len(prompts), batch):
        _append(total, decoder.generate(prompts[start : start + batch], max_new, **kwargs))
    return total


def decode_interleaved(
    decoder: Decoder, prompts, batch: int, max_new: int, settings: dict, rounds: int = 1, **kwargs
) -> dict:
    """Decode the prompts with every setting (name -> generate() keyword arguments), one
    batch of prompts at a time through all settings in turn, `rounds` times over.

    A shared or virtual machine drifts in speed by 10-20% over seconds; settings timed one
    after another would each catch a different phase of it. Taking them in turn on every
    batch (in an order rotated from batch to batch) lets each see the same machine, so
    their ratios (the speedups) hold even where the absolute times wander.
    Returns name -> DecodeResult over all rounds."""
    if rounds < 1:
        raise PerfkitError(f"rounds must be >= 1, got {rounds}")
    names = list(settings)
    totals = {name: DecodeResult([], [], []) for name in names}
    turn = 0
    for _ in range(rounds):
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                part = decoder.generate(chunk, max_new, **kwargs, **settings[name])
                _append(totals[name], part)
            turn += 1
    return totals


def _append(total: DecodeResult, part: DecodeResult) -> None:
    total.tokens += part.tokens
    total.accepted += part.accepted
    total.tree_sizes += part.tree_sizes
    total.prefill_s += part.prefill_s
    total.decode_s += part.decode_s
    for phase in STEP_PARTS:
        total.times[phase] += part.times[phase]


def mean_accepted(result: DecodeResult) -> float:
    steps = [a for row in result.accepted for a in row]
    return sum(steps) / len(steps)


def head_accuracy(decoder: Decoder, prompts, outputs) -> np.ndarray:
    """a_k^(i) on the decoded continuations: rank i of head k against the token actually
    produced k+1 steps after the next."""
    rows = [p + o for p, o in zip(prompts, outputs)]
    width = min(len(r) for r in rows)
    tokens = torch.tensor([r[:width] for r in rows], device=decoder.device)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, len(prompts[0]) :] = True
    with torch.inference_mode():
        logits = decoder.heads(decoder.model.hidden(tokens))
    return topk_accuracy(logits, tokens, HEAD_TOP_K, mask)


def measure(args) -> dict:
    ckpt = load_checkpoint(args.model, args.heads)
    if ckpt.heads is None:
        raise PerfkitError(f"{ckpt.folder} has no Medusa heads (medusa_num_heads in config.json); pass --heads DIR")
    torch.manual_seed(args.seed)
    decoder = Decoder(ckpt)
    acceptance = AcceptanceConfig(args.acceptance, temperature=args.temperature, seed=args.seed)
    prompts = heldout_prompts(ckpt, args.prompts, args.prompt_len, args.seed)
    eos = ckpt.config.eos_token_id
    run_kwargs = dict(acceptance=acceptance, topk=HEAD_TOP_K)

    # Warm-up: the first calls of every kernel are slow; none of this is timed.
    decoder.generate(prompts[: args.batch], 8, **run_kwargs)
    decoder.generate(
        prompts[: args.batch], 8, tree=greedy_tree(np.full((len(ckpt.heads), HEAD_TOP_K), 0.5), 8), **run_kwargs
    )
    # The head accuracies choose the trees, so a first plain pass (not timed) comes before the runs compared.
    accuracy = head_accuracy(
        decoder, prompts, decode_batches(decoder, prompts, args.batch, args.new_tokens, **run_kwargs).tokens
    )
    tree = resolve_tree(args.tree, ckpt, accuracy)
    nodes = args.dynamic if args.dynamic else 0
    wanted = sorted(
        set(args.sizes) | ({tree.size} if not nodes and tree == greedy_tree(accuracy, tree.size - 1) else set())
    )
    sized_trees = {size: greedy_tree(accuracy, size - 1) for size in wanted}
    # Every run timed in turn, prompt batch by prompt batch, so their tokens/s ratios see the same machine.
    settings = {"plain": {}, "medusa": {"tree": None if nodes else tree, "dynamic_nodes": nodes}}
    for size, sized in sized_trees.items():
        if size > 1 and (nodes or sized != tree):
            settings[f"size-{size}"] = {"tree": sized}
    runs = decode_interleaved(decoder, prompts, args.batch, args.new_tokens, settings, args.rounds, **run_kwargs)
    baseline, medusa = runs["plain"], runs["medusa"]

    sizes = []
    for size, sized in sized_trees.items():
        result = baseline if size == 1 else medusa if (not nodes and sized == tree) else runs[f"size-{size}"]
        sizes.append(
            {
                "tree_size": size,
                "nodes": size - 1,
                "mean_accepted_tokens": round(mean_accepted(result), 4),
                "predicted_from_accuracy": round(expected_acceptance(sized, accuracy), 4),
                "tokens_per_s": round(result.tokens_per_s, 1),
                "steps": result.steps,
                "lossless": result.tokens == baseline.tokens
                if not acceptance.samples and acceptance.scheme == "greedy"
                else None,
            }
        )
    histogram = Counter(a for row in medusa.accepted for a in row)
    step_time = sum(medusa.times.values())
    report = {
        "model": str(ckpt.folder),
        "acceptance": acceptance.__dict__,
        "tree": {
            "name": f"dynamic-{nodes}" if nodes else args.tree,
            "size": nodes + 1 if nodes else tree.size,
            "paths": None if nodes else [list(p) for p in tree.paths],
        },
        "dynamic": bool(nodes),
        "batch": args.batch,
        "prompts": len(prompts),
        "prompt_tokens": args.prompt_len,
        "new_tokens_per_prompt": args.new_tokens,
        "mean_accepted_tokens": round(mean_accepted(medusa), 4),
        "accepted_length_histogram": {str(k): histogram[k] for k in sorted(histogram)},
        "head_topk_accuracy": np.round(accuracy, 4).tolist(),
        "per_tree_size": sizes,
        "tokens_per_s_medusa": round(medusa.tokens_per_s, 1),
        "tokens_per_s_baseline": round(baseline.tokens_per_s, 1),
        "wall_speedup": round(medusa.tokens_per_s / baseline.tokens_per_s, 3),
        "steps_medusa": medusa.steps,
        "steps_baseline": baseline.steps,
        "step_time_split_s": {p: round(medusa.times[p], 4) for p in STEP_PARTS},
        "step_time_split_fraction": {p: round(medusa.times[p] / step_time, 4) for p in STEP_PARTS},
        "lossless": (medusa.tokens == baseline.tokens) if acceptance.scheme == "greedy" else None,
        "eos_token_id": eos,
        "rounds": args.rounds,
        "timing": "interleaved: plain and every tree in turn on each batch of prompts",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    return report


def build_parser() -> Parser:
    p = Parser(prog="python -m decoder.measure", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", default="bundled", metavar="DIR|bundled", help="checkpoint folder (default: the bundled model)"
    )
    p.add_argument("--heads", metavar="DIR", help="Medusa heads folder, when apart from the model")
    p.add_argument("--tree", default="default", metavar="NAME|FILE", help=TREE_NAMES)
    p.add_argument(
        "--acceptance",
        choices=SCHEMES,
        default="greedy",
        help="acceptance scheme: greedy (lossless), typical or rejection (default %(default)s)",
    )
    p.add_argument("--temperature", type=float, default=0.7, help="for typical and rejection (default %(default)s)")
    p.add_argument(
        "--dynamic",
        type=positive_int,
        nargs="?",
        const=48,
        metavar="N",
        help="dynamic tree of N nodes per step (default N 48)",
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        default=1,
        metavar="B",
        help="prompts decoded together, each accepting its own tokens per step (default %(default)s)",
    )
    p.add_argument("--prompts", type=positive_int, default=16, help="held-out prompts (default %(default)s)")
    p.add_argument("--prompt-len", type=positive_int, default=64, help="tokens per prompt (default %(default)s)")
    p.add_argument(
        "--new-tokens", type=positive_int, default=96, help="tokens to generate per prompt (default %(default)s)"
    )
    p.add_argument(
        "--sizes",
        type=positive_int,
        nargs="+",
        default=list(DEFAULT_SIZES),
        metavar="Q",
        help="tree sizes (root + nodes) for the acceptance curve (default 1 4 16 64)",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="times every run goes over the prompts, interleaved (default %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="random seed for prompt choice and sampling (default %(default)s)",
    )
    p.add_argument(
        "--out", type=Path, required=True, metavar="FILE.json", help="where to write the acceptance record (JSON)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    report = measure(args)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(
        f"{args.out}: {report['mean_accepted_tokens']:.2f} tokens/step with tree {report['tree']['name']} "
        f"({report['tree']['size']} tokens), {report['tokens_per_s_medusa']:.0f} vs "
        f"{report['tokens_per_s_baseline']:.0f} tokens/s "
        f"(x{report['wall_speedup']:.2f}), lossless: {report['lossless']}, {report['wall_s']:.0f} s"
    )
    for row in report["per_tree_size"]:
        print(
            f"  tree size {row['tree_size']:>3}: {row['mean_accepted_tokens']:.2f} tokens/step (predicted from "
            f"accuracies {row['predicted_from_accuracy']:.2f}), {row['tokens_per_s']:.0f} tokens/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
