"""python -m decoder.generate --prompt TEXT: try the model, streaming text as it is accepted."""

from __future__ import annotations

import sys

from decoder.acceptance import SCHEMES, AcceptanceConfig
from decoder.auto_tree import auto_tree, default_tree_name
from decoder.checkpoint import load_checkpoint
from decoder.medusa import DRAFTERS, Decoder, check_context
from decoder.static_step import check_launch
from decoder.tree import TREE_NAMES, resolve_tree
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.cli import Parser, options, positive_int, positive_number, run


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


def build_parser() -> Parser:
    p = Parser(prog="python -m decoder.generate", description=__doc__)
    p.add_argument("--prompt", required=True, help="text to continue")
    options.model(p, needs_weights=True)
    p.add_argument("--heads", metavar="DIR", help="Medusa heads folder, when apart from the model")
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=200,
        metavar="N",
        help="tokens to generate after the prompt (default %(default)s)",
    )
    p.add_argument(
        "--tree",
        metavar="auto|NAME|FILE",
        help=f"auto (the performance model's best tree for this machine, or plain decoding where no tree beats it; "
        f"the default where the checkpoint records head accuracies), {TREE_NAMES}",
    )
    options.acceptance(p, choices=SCHEMES)
    p.add_argument(
        "--temperature",
        type=positive_number,
        default=0.7,
        metavar="T",
        help="sampling temperature for typical and rejection acceptance (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="random seed for sampling (default %(default)s)")
    p.add_argument("--no-medusa", action="store_true", help="plain decoding, for comparison")
    options.drafter(p, choices=DRAFTERS)
    p.add_argument(
        "--recalibrate",
        action="store_true",
        help="--tree auto: measure this machine's step times again instead of using the cached calibration",
    )
    options.launch(p)
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
    args = build_parser().parse_args(argv)
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
            context = len(ids) + args.max_new_tokens // 2
            choice, tree = auto_tree(decoder, ckpt, 1, context, args.max_new_tokens, say, args.recalibrate)
            say(f"--tree auto: {choice.describe()}")
        else:
            tree = resolve_tree(name, ckpt)
    sys.stdout.write(args.prompt)
    result = decoder.generate(
        [ids],
        args.max_new_tokens,
        tree=tree,
        acceptance=AcceptanceConfig(args.acceptance, temperature=args.temperature, seed=args.seed),
        eos=ckpt.config.eos_token_id,
        on_tokens=Streamer(ckpt.tokenizer),
        drafter=args.drafter,
        launch=args.launch,
    )
    print()
    print(
        f"[{result.new_tokens} tokens in {result.steps} steps ({result.new_tokens / result.steps:.2f} per step), "
        f"{result.tokens_per_s:.0f} tokens/s{'' if tree is None else f', tree of {tree.size} tokens'}]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
