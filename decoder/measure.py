"""python -m decoder.measure: real acceptance rates of Medusa heads, and real speedups.

Decodes held-out prompts (the 5% of the standard library never trained on) twice, with
plain decoding and with Medusa, and records what the performance model needs: tokens
accepted per step, how often each head's rank-i guess is right (a_k^(i)), acceptance at
several tree sizes, tokens per second both ways, where a Medusa step spends its time, and
whether greedy Medusa reproduced greedy decoding exactly.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections import Counter

import numpy as np
import torch

from decoder.acceptance import AcceptanceConfig
from decoder.auto_tree import auto_tree, default_tree_name
from decoder.checkpoint import load_checkpoint
from decoder.heads import topk_accuracy
from decoder.measure_options import MeasureOptions
from decoder.medusa import Decoder, check_context
from decoder.runs import decode_batches, decode_interleaved, heldout_prompts, mean_accepted
from decoder.static_step import check_launch
from decoder.trace_ops import TORCH_DTYPES
from decoder.tree import Drafting, resolve_tree
from decoder.twin import ReplayRecord, dummy_checkpoint, native_dtype, random_prompts
from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.acceptance.trees import expected_acceptance, greedy_tree
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.outputs import writable_file
from perfmodel.cli import Parser, run
from perfmodel.cli.fields import add_options, read_options
from perfmodel.models.operators import HEAD_TOP_K


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


def check_drafter(args: MeasureOptions, ckpt) -> None:
    """EAGLE drafts the static trees the heads' accuracies shape (the same trees Medusa runs,
    so the two compare at equal tree sizes) or, with --dynamic, EAGLE-2's own dynamic trees:
    it needs the drafter, and not --tree auto (priced for the heads)."""
    if args.drafter != DrafterKind.EAGLE:
        return
    if ckpt.eagle is None:
        raise PerfkitError(f"{ckpt.folder} has no EAGLE drafter; python -m decoder.train --eagle --model {ckpt.folder}")
    if args.tree == "auto":
        raise PerfkitError("--tree auto prices the Medusa heads' trees; give --drafter eagle a tree by name")


def per_depth_acceptance(path_lengths: list[list[int]]) -> list[float]:
    """The share of steps whose accepted path reached each depth 1, 2, ... (the root is depth 0
    and always accepted): how far down the tree the drafts hold."""
    lengths = np.array([n for row in path_lengths for n in row])
    if lengths.size == 0:
        return []
    return [round(float((lengths > d).mean()), 4) for d in range(1, int(lengths.max()))]


def batch_run(batch: int, prompts: int, log=print) -> int:
    """The batch actually decoded: at most the number of prompts (said so where cut), so the
    record never claims a batch larger than what ran."""
    if batch <= prompts:
        return batch
    log(f"--batch {batch} is more than the {prompts} prompts: decoding them as one batch of {prompts} (recorded so)")
    return prompts


def measure_twin(args: MeasureOptions) -> dict:
    """--weights dummy --replay RECORD: plain decoding and every recorded tree of a twin
    (decoder.twin) timed interleaved; the tokens per step are the record's, replayed, and the
    tokens/s and speedups are this machine's at the model's real size."""
    if args.replay is None:
        raise PerfkitError("--weights dummy needs --replay RECORD (a python -m decoder.measure record to replay)")
    for given, flag in ((args.heads, "--heads"), (args.tree, "--tree"), (args.dynamic, "--dynamic")):
        if given:
            raise PerfkitError(f"{flag} is for real weights; a twin runs the trees --replay recorded")
    record = ReplayRecord.load(args.replay)
    wanted = sorted({n for n in args.sizes if n > 1} & set(record.sizes)) or record.sizes
    dtype = native_dtype()
    ckpt = dummy_checkpoint(args.model, TORCH_DTYPES[dtype], medusa_heads=record.accuracy.shape[0], seed=args.seed)
    check_context(ckpt.config, args.prompt_len, args.new_tokens, "--new-tokens")
    decoder = Decoder(ckpt)
    prompts = random_prompts(ckpt.config.vocab_size, args.prompts, args.prompt_len, args.seed)
    batch = batch_run(args.batch, args.prompts, lambda text: print(text, file=sys.stderr))
    launch = {"launch": args.launch}
    settings = {"plain": launch} | {
        f"size-{n}": {"drafting": Drafting(record.tree(n)), "replay": record.replay(n), **launch} for n in wanted
    }
    for setting in settings.values():  # warm-up, untimed
        decoder.generate(prompts[:batch], 2, **{**setting, "replay": None})
    runs = decode_interleaved(decoder, prompts, batch, args.new_tokens, settings, args.rounds)
    baseline = runs["plain"]
    sizes = [
        {
            "tree_size": 1 if name == "plain" else int(name.split("-")[1]),
            "mean_accepted_tokens": round(mean_accepted(result), 4),
            "tokens_per_s": round(result.tokens_per_s, 2),
            "step_s": round(result.decode_s / result.steps, 6),
            "wall_speedup": round(result.tokens_per_s / baseline.tokens_per_s, 3),
            "steps": result.steps,
        }
        for name, result in runs.items()
    ]
    return {
        "model": str(ckpt.folder),
        "weights": "dummy",
        "replayed": str(args.replay),
        "dtype": dtype,
        "acceptance": {"scheme": "greedy", "replayed": True},
        "batch": batch,
        "prompts": len(prompts),
        "prompt_tokens": args.prompt_len,
        "new_tokens_per_prompt": args.new_tokens,
        "head_topk_accuracy": record.accuracy.tolist(),
        "per_tree_size": sizes,
        "best_fixed_tree": max(sizes, key=lambda row: row["wall_speedup"])["tree_size"],
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def measure(args: MeasureOptions) -> dict:
    if args.weights == "dummy":
        return measure_twin(args)
    if args.replay is not None:
        raise PerfkitError("--replay is for a twin: give --weights dummy")
    ckpt = load_checkpoint(args.model, args.heads)
    if ckpt.heads is None:
        raise PerfkitError(f"{ckpt.folder} has no Medusa heads (medusa_num_heads in config.json); pass --heads DIR")
    check_context(ckpt.config, args.prompt_len, args.new_tokens, "--new-tokens")
    check_drafter(args, ckpt)
    batch = batch_run(args.batch, args.prompts, lambda text: print(text, file=sys.stderr))
    torch.manual_seed(args.seed)
    decoder = Decoder(ckpt)
    check_launch(Launch.parse(args.launch), decoder.device, args.dynamic or 0)  # before any run
    acceptance = AcceptanceConfig(args.acceptance, temperature=args.temperature, seed=args.seed)
    prompts = heldout_prompts(ckpt, args.prompts, args.prompt_len, args.seed)
    eos = ckpt.config.eos_token_id
    run_kwargs = dict(acceptance=acceptance, launch=args.launch)
    drafted = functools.partial(Drafting, drafter=args.drafter)  # plain decoding drafts nothing, whoever is asked

    # Warm-up: the first calls of every kernel are slow; none of this is timed.
    warm = min(8, args.new_tokens)  # within the context the check above allowed
    decoder.generate(prompts[:batch], warm, **run_kwargs)
    warm_tree = greedy_tree(np.full((len(ckpt.heads), HEAD_TOP_K), 0.5), 8)
    decoder.generate(prompts[:batch], warm, drafted(warm_tree), **run_kwargs)
    # The head accuracies choose the trees, so a first plain pass (not timed) comes before the runs compared.
    accuracy = head_accuracy(
        decoder, prompts, decode_batches(decoder, prompts, batch, args.new_tokens, **run_kwargs).tokens
    )
    nodes = args.dynamic if args.dynamic else 0
    name = args.tree or ("default" if nodes else default_tree_name(ckpt, args.drafter))
    auto = None
    if name == "auto":
        auto, tree = auto_tree(decoder, ckpt, batch, args.prompt_len, args.new_tokens, recalibrate=args.recalibrate)
        if auto is None:
            name = "default"  # no kept calibration backs a choice: the default tree ran, unpriced (auto_tree said why)
        else:
            print(f"--tree auto: {auto.describe()}", file=sys.stderr)
    else:
        tree = resolve_tree(name, ckpt, accuracy)
    tree_size = 1 if tree is None else tree.size
    own_size = not nodes and (tree is None or tree == greedy_tree(accuracy, tree.size - 1))
    wanted = sorted(set(args.sizes) | ({tree_size} if own_size else set()))
    sized_trees = {size: greedy_tree(accuracy, size - 1) for size in wanted}
    # Every run timed in turn, prompt batch by prompt batch, so their tokens/s ratios see the same machine.
    # Where the run's tree is plain decoding (--tree auto found no tree faster), it is the plain
    # run: a second plain run beside it measured only the machine's noise (x0.945 at batch 4).
    plainly = tree is None and not nodes
    settings = {"plain": {}} | ({} if plainly else {"medusa": {"drafting": drafted(None if nodes else tree, nodes)}})
    for size, sized in sized_trees.items():
        if size > 1 and (nodes or sized != tree):
            settings[f"size-{size}"] = {"drafting": drafted(sized)}
    runs = decode_interleaved(decoder, prompts, batch, args.new_tokens, settings, args.rounds, **run_kwargs)
    baseline = runs["plain"]
    medusa = baseline if plainly else runs["medusa"]

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
                "wall_speedup": round(result.tokens_per_s / baseline.tokens_per_s, 3),
                "steps": result.steps,
                # what a performance twin replays (decoder.twin): each prompt's accepted paths
                **({"path_lengths": result.path_lengths} if size > 1 else {}),
                "lossless": result.tokens == baseline.tokens
                if not acceptance.samples and acceptance.scheme == "greedy"
                else None,
            }
        )
    histogram = Counter(a for row in medusa.accepted for a in row)
    step_time = sum(medusa.times.values())
    report = {
        "model": str(ckpt.folder),
        "drafter": args.drafter,
        "launch": args.launch,
        "acceptance": acceptance.__dict__,
        "tree": {
            "name": f"dynamic-{nodes}" if nodes else name,
            "size": nodes + 1 if nodes else tree_size,
            "paths": None if nodes else [list(p) for p in tree.paths] if tree is not None else [],
        },
        "auto": None
        if auto is None
        else {
            "chosen_size": auto.size,
            "decodes_plainly": not auto.speculate,
            "predicted_speedup": round(auto.speedup, 4),
            "latency": auto.latency,
            "predicted": auto.table.round(6).to_dict(orient="records"),
        },
        "dynamic": bool(nodes),
        "batch": batch,
        "batch_requested": args.batch,
        "prompts": len(prompts),
        "prompt_tokens": args.prompt_len,
        "new_tokens_per_prompt": args.new_tokens,
        "mean_accepted_tokens": round(mean_accepted(medusa), 4),
        "accepted_length_histogram": {str(k): histogram[k] for k in sorted(histogram)},
        "per_depth_acceptance": per_depth_acceptance(medusa.path_lengths),
        "head_topk_accuracy": np.round(accuracy, 4).tolist(),
        "per_tree_size": sizes,
        "tokens_per_s_medusa": round(medusa.tokens_per_s, 1),
        "tokens_per_s_baseline": round(baseline.tokens_per_s, 1),
        "wall_speedup": round(medusa.tokens_per_s / baseline.tokens_per_s, 3),
        "best_fixed_tree": max(sizes, key=lambda row: row["wall_speedup"])["tree_size"],
        "steps_medusa": medusa.steps,
        "steps_baseline": baseline.steps,
        "step_time_split_s": {p: round(s, 4) for p, s in medusa.times.items()},
        "step_time_split_fraction": {p: round(s / step_time, 4) for p, s in medusa.times.items()},
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
    add_options(p, MeasureOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(MeasureOptions, build_parser().parse_args(argv))
    writable_file(args.out, "acceptance record (--out)")  # before minutes of decoding, not after
    started = time.perf_counter()
    report = measure(args)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    # Written through the record's one reader, so nothing is written that it would refuse.
    args.out.write_text(json.dumps(AcceptanceRecord.from_dict(report, args.out).to_dict(), indent=1))
    if report.get("weights") == "dummy":
        print(f"{args.out}: a twin of {report['model']} ({report['dtype']}, dummy weights), {args.replay} replayed")
        for row in report["per_tree_size"]:
            print(
                f"  tree size {row['tree_size']:>3}: {row['mean_accepted_tokens']:.2f} tokens/step, "
                f"{row['step_s'] * 1e3:.1f} ms/step, {row['tokens_per_s']:.1f} tokens/s (x{row['wall_speedup']:.2f})"
            )
        return 0
    print(
        f"{args.out}: {report['mean_accepted_tokens']:.2f} tokens/step with tree {report['tree']['name']} "
        f"({report['tree']['size']} tokens), {report['tokens_per_s_medusa']:.0f} vs "
        f"{report['tokens_per_s_baseline']:.0f} tokens/s "
        f"(x{report['wall_speedup']:.2f}), lossless: {report['lossless']}, {report['wall_s']:.0f} s"
    )
    for row in report["per_tree_size"]:
        print(
            f"  tree size {row['tree_size']:>3}: {row['mean_accepted_tokens']:.2f} tokens/step (predicted from "
            f"accuracies {row['predicted_from_accuracy']:.2f}), {row['tokens_per_s']:.0f} tokens/s "
            f"(x{row['wall_speedup']:.2f})"
        )
    best = next(r for r in report["per_tree_size"] if r["tree_size"] == report["best_fixed_tree"])
    print(
        f"  best tree in this run: {best['tree_size']} tokens (x{best['wall_speedup']:.2f}); "
        f"the run's tree ({report['tree']['name']}): x{report['wall_speedup']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
