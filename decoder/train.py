"""python -m decoder.train: reproduce the bundled model, its tokenizer and its Medusa heads.

Stages (intermediate results kept in --work, so an interrupted run resumes):
1. tokenizer: byte-level BPE trained on the standard library's source (decoder.corpus);
2. backbone: a small Llama trained from scratch on the training files;
3. self-distillation: the backbone continues prompts from the training files (greedy);
4. Medusa-1 heads: backbone frozen, loss sum_k 0.8^k CE(head k, token t+k+1) on the
   backbone's own continuations;
5. head accuracies a_k^(i) on held-out continuations, and the paper's greedy tree built
   from them as the default tree.
The backbone is rounded to the fp16 it ships in as soon as it is trained, and the heads
before they are measured: every later stage and every figure recorded is that of the
weights shipped, so a reader recomputing them from the checkpoint gets the same numbers.
The result (fp16 weights, ~11 MB) is written in the Hugging Face layout with the heads
in the reference layout, plus training.json with the costs and figures of each stage and
checksums.sha256. It replaces the output folder whole (decoder.checkpoint.replacing);
an existing checkpoint there is replaced only with --force, or when confirmed at a terminal.

--medusa2 runs Medusa-2 on such a checkpoint instead (decoder.medusa2): LoRA on the
backbone trained jointly with the heads, on the original model's continuations.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from decoder import medusa2
from decoder.checkpoint import BUNDLED, folder_in_the_way, load_checkpoint
from decoder.draft_train import QUICK_DRAFT, DraftConfig, build_draft
from decoder.eagle import EagleLayout
from decoder.eagle_train import QUICK_EAGLE, EagleConfig, build_eagle
from decoder.medusa2_build import build_medusa2
from decoder.stages import (
    QUICK,
    TrainConfig,
)
from decoder.training import build
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import writable_dir
from perfmodel.cli import Parser, options, positive_int, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.models.config import DRAFT_MODEL

DEFAULT_OUT = Path("perf-reports") / "trained"
DEFAULT_WORK = Path("perf-reports") / "train-work"
MEDUSA2_OUT = Path("perf-reports") / "trained-medusa2"
MEDUSA2_WORK = Path("perf-reports") / "medusa2-work"
EAGLE_OUT = Path("perf-reports") / "trained-eagle"
DRAFT_OUT = Path("perf-reports") / "trained-draft"


TARGET = ("target", False)  # --out or --install


@dataclass(frozen=True)
class TrainOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    out: Path = field(
        default=DEFAULT_OUT,
        metadata=shared(
            options.out,
            default=f"{DEFAULT_OUT}; {MEDUSA2_OUT} with --medusa2",
            what="the checkpoint folder",
            value=DEFAULT_OUT,
            exclusive=TARGET,
        ),
    )
    install: bool = field(
        default=False,
        metadata=option(
            "--install",
            f"replace the bundled model ({BUNDLED}) with the one trained",
            action="store_true",
            exclusive=TARGET,
        ),
    )
    force: bool = field(
        default=False,
        metadata=option(
            "--force",
            "replace the checkpoint already in the output folder (or the bundled one, with --install) without "
            "asking; without it, a terminal is asked and anything else refused",
            action="store_true",
        ),
    )
    work: Path = field(
        default=DEFAULT_WORK,
        metadata=option(
            "--work",
            f"intermediate results, for resuming (default %(default)s; {MEDUSA2_WORK} with --medusa2)",
            type=Path,
            metavar="DIR",
        ),
    )
    seed: int = field(
        default=0,
        metadata=option(
            "--seed", "random seed of data order and initial weights (default %(default)s)", type=int, metavar="N"
        ),
    )
    steps: int | None = field(
        default=None,
        metadata=option("--steps", "backbone training steps (default 2000; 16 x 256 tokens each)", type=positive_int),
    )
    quick: bool = field(
        default=False,
        metadata=option(
            "--quick", "a tiny model on 30 files in about a minute, to try the pipeline", action="store_true"
        ),
    )
    medusa2: bool = field(
        default=False,
        metadata=option(
            "--medusa2",
            "Medusa-2 instead: LoRA on the backbone trained jointly with the heads of a Medusa-1 checkpoint (--model)"
            ", on the original model's continuations; with --quick, a few sequences for one epoch",
            action="store_true",
        ),
    )
    eagle: bool = field(
        default=False,
        metadata=option(
            "--eagle",
            "train an EAGLE drafter (decoder.eagle) for a checkpoint (--model) on its own continuations and write the "
            f"checkpoint with it (default {EAGLE_OUT}; --install: into the bundled model); with --quick, a few "
            "sequences",
            action="store_true",
        ),
    )
    eagle_layout: EagleLayout = field(
        default=EagleLayout.PROJECT,
        metadata=option(
            "--eagle-layout",
            "with --eagle: the drafter's layer as this project builds it, or vllm: vLLM's EAGLE-1 layer (no fc bias, "
            "no norms around the layer, attention over the whole prefix) for python -m profilers.engine "
            "--speculation eagle (default %(default)s)",
            choices=[member.value for member in EagleLayout],
        ),
    )
    draft_model: bool = field(
        default=False,
        metadata=option(
            "--draft-model",
            "train a draft model for a checkpoint (--model): a one-layer Llama of its tokenizer distilled on its own "
            f"continuations, for python -m profilers.engine --speculation draft (default {DRAFT_OUT}; --install: "
            f"{DRAFT_MODEL.relative_to(DRAFT_MODEL.parents[2])}, the model named draft); with --quick, a few sequences",
            action="store_true",
        ),
    )
    # None unless --model is given (main seeds the parse with it): without --medusa2, --eagle or --draft-model it
    # is refused
    model: str | None = field(default=None, metadata=shared(options.model, needs_weights=True))


def build_parser() -> Parser:
    p = Parser(prog="python -m decoder.train", description=__doc__.split("\n\n")[0])
    add_options(p, TrainOptions)
    return p


def eagle_main(parser: Parser, args: TrainOptions) -> int:
    if args.steps or args.medusa2:
        parser.error("--eagle trains the drafter alone: --steps and --medusa2 do not apply")
    layout = EagleLayout(args.eagle_layout)
    config = dataclasses.replace(QUICK_EAGLE if args.quick else EagleConfig(), seed=args.seed, layout=layout)
    out = BUNDLED if args.install else (EAGLE_OUT if args.out == DEFAULT_OUT else args.out)
    checkpoint = load_checkpoint(args.model or "bundled")
    if out.resolve() != checkpoint.folder.resolve():
        check_output(out, args.work, args.force)
    started = time.perf_counter()
    card = build_eagle(checkpoint, out, config, quick_corpus=args.quick)
    heads = card.get("medusa_heads_parameters")
    beside = f" (the Medusa heads: {heads:,})" if heads else ""
    print(
        f"wrote {out} in {time.perf_counter() - started:.0f} s: EAGLE drafter ({layout} layout) of "
        f"{card['parameters']:,} parameters"
        f"{beside}, held-out top-1 {card['heldout_top1']}"
    )
    return 0


def draft_main(parser: Parser, args: TrainOptions) -> int:
    if args.steps or args.medusa2 or args.eagle:
        parser.error("--draft-model trains the draft alone: --steps, --medusa2 and --eagle do not apply")
    config = dataclasses.replace(QUICK_DRAFT if args.quick else DraftConfig(), seed=args.seed)
    out = DRAFT_MODEL if args.install else (DRAFT_OUT if args.out == DEFAULT_OUT else args.out)
    checkpoint = load_checkpoint(args.model or "bundled")
    check_output(out, args.work, args.force)
    started = time.perf_counter()
    card = build_draft(checkpoint, out, config, quick_corpus=args.quick)
    print(
        f"wrote {out} in {time.perf_counter() - started:.0f} s: a draft model of {card['parameters']:,} parameters "
        f"(the target: {card['target_parameters']:,}), held-out top-1 {card['heldout_top1']}"
    )
    return 0


def check_output(out: Path, work: Path, force: bool) -> None:
    """Before any training: the output and work folders can be written, and a checkpoint
    already at `out` is replaced only when asked to (--force) or confirmed at a terminal."""
    writable_dir(work, "work folder")
    writable_dir(out.parent, "folder of the checkpoint")
    reason = folder_in_the_way(out)
    if reason is None:
        return
    if not out.is_dir():
        raise PerfkitError(f"{reason}: give a folder for the checkpoint")
    if not (out / "config.json").is_file():
        raise PerfkitError(f"{out} is not a checkpoint folder (no config.json); choose a new or empty folder")
    if force:
        return
    if sys.stdin.isatty():
        try:
            answer = input(f"{reason}: replace it with the model trained? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            return
        raise PerfkitError(f"{out} left as it was (answer y to replace it, or add --force)")
    raise PerfkitError(f"{reason}; add --force to replace it (nothing was trained)")


def medusa2_main(parser: Parser, args: TrainOptions, argv: list[str] | None) -> int:
    if args.install:
        parser.error("--install replaces the bundled Medusa-1 model; write Medusa-2 with --out DIR")
    if args.steps:
        parser.error("--steps sets the backbone's steps; --medusa2 trains for the epochs of its config")
    config = dataclasses.replace(medusa2.QUICK if args.quick else medusa2.Medusa2Config(), seed=args.seed)
    out = MEDUSA2_OUT if args.out == DEFAULT_OUT else args.out
    work = MEDUSA2_WORK if args.work == DEFAULT_WORK else args.work
    command = shlex.join(["python", "-m", "decoder.train", *(sys.argv[1:] if argv is None else argv)])
    check_output(out, work, args.force)
    started = time.perf_counter()
    card = build_medusa2(config, args.model or "bundled", out, work, command)
    figures = card["medusa2"]
    default = next(
        r for r in figures["expected_tokens_per_step"] if r["tree_tokens"] == card["default_tree"]["nodes"] + 1
    )
    quality = figures["quality"]
    print(
        f"wrote {out} ({card['assets_bytes'] / 1e6:.1f} MB) in {time.perf_counter() - started:.0f} s: expected tokens "
        f"per step with a {default['tree_tokens']}-token tree {default['medusa1']} (Medusa-1) -> {default['medusa2']} "
        f"(Medusa-2); held-out loss {quality['heldout_loss_original']} -> {quality['heldout_loss_medusa2']}; greedy "
        f"tokens identical to the original's {quality['greedy_agreement']['tokens_identical']:.1%}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # model=None in the namespace survives parsing unless --model is given (argparse fills in
    # only missing defaults): an explicit --model bundled without --medusa2 is refused too.
    args = read_options(TrainOptions, parser.parse_args(argv, namespace=argparse.Namespace(model=None)))
    if args.draft_model:
        return draft_main(parser, args)
    if args.eagle:
        return eagle_main(parser, args)
    if args.medusa2:
        return medusa2_main(parser, args, argv)
    if args.model is not None:
        parser.error(
            "--model picks the checkpoint --medusa2, --eagle or --draft-model starts from; without them a model is "
            "trained anew"
        )
    config = QUICK if args.quick else TrainConfig()
    config = dataclasses.replace(config, seed=args.seed, **({"steps": args.steps} if args.steps else {}))
    out = BUNDLED if args.install else args.out
    check_output(out, args.work, args.force)
    started = time.perf_counter()
    card = build(config, out, args.work)
    print(f"wrote {out} ({card['assets_bytes'] / 1e6:.1f} MB) in {time.perf_counter() - started:.0f} s")
    if not args.install:
        print(f"use it with --model {out}; --install puts it in place of the bundled model")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
