"""python -m decoder.generate --prompt TEXT: try the model, streaming text as it is accepted."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from decoder.acceptance import SCHEMES, AcceptanceConfig
from decoder.auto_tree import auto_tree, default_tree_name
from decoder.checkpoint import load_checkpoint
from decoder.medusa import DRAFTERS, Decoder, check_context
from decoder.static_step import check_launch
from decoder.tree import TREE_NAMES, Drafting, resolve_tree
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.cli import Parser, options, positive_int, positive_number, run
from perfmodel.cli.fields import add_options, option, read_options, shared


class Streamer:
    """Prints the text of a growing token list; byte-level BPE can split a character
    across tokens, so only the settled prefix is printed."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out, self.ids, self.shown = tokenizer, out or sys.stdout, [], ""

    def __call__(self, _row: int, tokens: list[int]) -> None:
        self.ids += tokens
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an unfinished multi-byte character: wait for the rest
            return
        self.out.write(text[len(self.shown) :])
        self.out.flush()
        self.shown = text


def say(text: str) -> None:
    """Notes go to stderr, so stdout carries the generated text only."""
    print(text, file=sys.stderr)


@dataclass(frozen=True)
class GenerateOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    prompt: str = field(default="", metadata=option("--prompt", "text to continue", required=True))
    model: str = field(default="bundled", metadata=shared(options.model, needs_weights=True))
    heads: str | None = field(default=None, metadata=shared(options.heads))
    max_new_tokens: int = field(
        default=200,
        metadata=option(
            "--max-new-tokens",
            "tokens to generate after the prompt (default %(default)s)",
            type=positive_int,
            metavar="N",
        ),
    )
    tree: str | None = field(
        default=None,
        metadata=option(
            "--tree",
            "auto (the performance model's best tree for this machine from its step times, calibrated once and "
            "kept, or plain decoding where no tree beats it); without --tree: auto where the checkpoint records "
            "head accuracies and a calibration is kept (none is measured), else default; "
            f"{TREE_NAMES}",
            metavar="auto|NAME|FILE",
        ),
    )
    acceptance: str | None = field(default=None, metadata=shared(options.acceptance, choices=SCHEMES))
    temperature: float = field(
        default=0.7,
        metadata=option(
            "--temperature",
            "sampling temperature for typical and rejection acceptance (default %(default)s)",
            type=positive_number,
            metavar="T",
        ),
    )
    seed: int = field(
        default=0,
        metadata=option("--seed", "random seed for sampling (default %(default)s)", type=int, metavar="N"),
    )
    no_medusa: bool = field(
        default=False, metadata=option("--no-medusa", "plain decoding, for comparison", action="store_true")
    )
    drafter: str = field(default=DrafterKind.MEDUSA, metadata=shared(options.drafter, choices=DRAFTERS))
    recalibrate: bool = field(default=False, metadata=shared(options.recalibrate))
    launch: str = field(default="eager", metadata=shared(options.launch))


def build_parser() -> Parser:
    p = Parser(prog="python -m decoder.generate", description=__doc__)
    add_options(p, GenerateOptions)
    return p


def check_text(text: str, what: str) -> None:
    """One line where a command-line argument is not text: bytes that are not UTF-8 reach
    Python as lone surrogates, which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = ord(text[exc.start]) - 0xDC00 if 0xDC80 <= ord(text[exc.start]) <= 0xDCFF else ord(text[exc.start])
        raise PerfkitError(f"{what} is not UTF-8 text (byte {byte:#04x} at character {exc.start})") from None


def main(argv: list[str] | None = None) -> int:
    args = read_options(GenerateOptions, build_parser().parse_args(argv))
    check_text(args.prompt, "--prompt")
    ckpt = load_checkpoint(args.model, args.heads)
    if ckpt.tokenizer is None:
        raise PerfkitError(f"{ckpt.folder} has no tokenizer.json")
    ids = ckpt.tokenizer.encode(args.prompt).ids
    if not args.prompt or not ids:
        raise PerfkitError("empty prompt: give some text to continue")
    check_context(ckpt.config, len(ids), args.max_new_tokens, "--max-new-tokens")
    if args.drafter == DrafterKind.EAGLE and (args.no_medusa or args.tree == "auto" or ckpt.eagle is None):
        raise PerfkitError(
            f"{ckpt.folder} has no EAGLE drafter (python -m decoder.train --eagle)"
            if ckpt.eagle is None
            else "--drafter eagle drafts a tree by name: not with --no-medusa or --tree auto"
        )
    tree = None
    decoder = Decoder(ckpt)
    check_launch(Launch.parse(args.launch), decoder.device)  # before a calibration runs
    if not args.no_medusa:
        if ckpt.heads is None:
            raise PerfkitError(f"{ckpt.folder} has no Medusa heads; use --no-medusa or --heads DIR")
        name = args.tree or default_tree_name(ckpt, args.drafter)
        if name == "auto":
            # A calibration takes far longer than the run: only one asked for (--tree auto,
            # --recalibrate) measures it; without, a kept one serves, else the default tree.
            asked = args.tree == "auto"
            choice, tree = auto_tree(decoder, ckpt, 1, len(ids), args.max_new_tokens, say, args.recalibrate, asked)
            if choice is not None:
                say(f"--tree auto: {choice.describe()}")
        else:
            tree = resolve_tree(name, ckpt)
    sys.stdout.write(args.prompt)
    result = decoder.generate(
        [ids],
        args.max_new_tokens,
        Drafting(tree, drafter=args.drafter),
        acceptance=AcceptanceConfig(args.acceptance, temperature=args.temperature, seed=args.seed),
        eos=ckpt.config.eos_token_id,
        on_tokens=Streamer(ckpt.tokenizer),
        launch=args.launch,
    )
    print()
    # "measured": this run's own counts, not the performance model's (a prediction above says "predicted")
    shape = "" if tree is None else f", tree of {tree.size} tokens"
    print(
        f"[measured: {result.new_tokens} tokens in {result.steps} steps ({result.new_tokens / result.steps:.2f} "
        f"per step), {result.tokens_per_s:.0f} tokens/s{shape}]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
