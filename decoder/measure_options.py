"""The options of python -m decoder.measure (MeasureOptions): the command's parser is
generated from them, and its run reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from decoder.acceptance import SCHEMES
from decoder.medusa import DRAFTERS
from decoder.tree import TREE_NAMES
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.cli import batch_size, options, positive_int
from perfmodel.cli.fields import along, option, shared

DEFAULT_SIZES = (1, 4, 16, 64)  # plus the measured tree's own size


@dataclass(frozen=True)
class MeasureOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    model: str = field(default="bundled", metadata=shared(options.model, needs_weights=True))
    heads: str | None = field(default=None, metadata=shared(options.heads))
    tree: str | None = field(
        default=None,
        metadata=option(
            "--tree",
            "auto (the performance model's best tree for this machine, batch and context, or plain decoding where "
            f"no tree beats it; the default where the checkpoint records head accuracies), {TREE_NAMES}",
            metavar="auto|NAME|FILE",
        ),
    )
    acceptance: str | None = field(default=None, metadata=shared(options.acceptance, choices=SCHEMES))
    drafter: str = field(default=DrafterKind.MEDUSA, metadata=shared(options.drafter, choices=DRAFTERS))
    temperature: float = field(
        default=0.7,
        metadata=option("--temperature", "for typical and rejection (default %(default)s)", type=float),
    )
    dynamic: int | None = field(
        default=None,
        metadata=option(
            "--dynamic",
            "dynamic tree of N nodes per step (default N 48)",
            type=positive_int,
            nargs="?",
            const=48,
            metavar="N",
        ),
    )
    batch: int = field(
        default=1,
        metadata=option(
            "--batch",
            "prompts decoded together, each accepting its own tokens per step; at most --prompts (default %(default)s)",
            type=batch_size,
            metavar="B",
        ),
    )
    prompts: int = field(
        default=16, metadata=option("--prompts", "held-out prompts (default %(default)s)", type=positive_int)
    )
    prompt_len: int = field(
        default=64, metadata=option("--prompt-len", "tokens per prompt (default %(default)s)", type=positive_int)
    )
    new_tokens: int = field(
        default=96,
        metadata=option("--new-tokens", "tokens to generate per prompt (default %(default)s)", type=positive_int),
    )
    sizes: tuple[int, ...] = field(
        default=tuple(DEFAULT_SIZES),
        metadata=option(
            "--sizes",
            "tree sizes (root + nodes) for the acceptance curve (default 1 4 16 64)",
            type=positive_int,
            nargs="+",
            metavar="Q",
        ),
    )
    rounds: int = field(
        default=1,
        metadata=option(
            "--rounds", "times every run goes over the prompts, interleaved (default %(default)s)", type=positive_int
        ),
    )
    seed: int = field(
        default=0,
        metadata=option(
            "--seed", "random seed for prompt choice and sampling (default %(default)s)", type=int, metavar="N"
        ),
    )
    recalibrate: bool = field(default=False, metadata=shared(options.recalibrate))
    weights: str = field(default="real", metadata=shared(options.twin))
    replay: Path | None = field(default=None, metadata=along("weights"))
    out: Path = field(
        default=None,
        metadata=shared(
            options.out, default=None, what="the acceptance record (JSON)", metavar="FILE.json", required=True
        ),
    )
    launch: str = field(default="eager", metadata=shared(options.launch))
