"""The closed loop's settings, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass

from decoder.medusa import DRAFTERS
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError

DEFAULT_SIZES = (2, 4, 8, 16, 32, 64)
TARGET_ERROR = 0.10
# The operators the reference decoder runs in a step (perfmodel.latency.step), as it runs them.
STEP_FLAVOR = "reference"
# model (the default): the cache flushed by the model's weight bytes before each sample, as
# the rest of a step streams them between two reads of the same weights; none: warm, the
# weights of a small model left in the nearer caches (its GEMMs then priced 20-45% under
# what they cost in tree steps: docs/closed-loop.md); all: evict everything (the paper's method for
# a 7B model on a GPU, whose weights never fit in L2).
FLUSH_MODES = ("none", "model", "all")
# Batches of prompts every setting decodes, at the least, by default (ValidateConfig.decode_rounds).
MIN_TIMED_BATCHES = 16
VALIDATED_DRAFTERS = DRAFTERS  # the decoder's own: the Medusa heads and the EAGLE drafter
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
    flush: str = "model"  # cache state of the operator timings: model, none (warm), all
    threads: int = 1  # CPU threads for the decoder and the operator timings alike
    seed: int = 0
    acceptance: str = "greedy"  # greedy or typical
    dynamic: bool = False  # also run the dynamic tree of every size
    drafter: str = "medusa"  # who drafts the trees: the Medusa heads or the EAGLE drafter
    in_step: bool = (
        False  # also profile each operator inside the step, beside its price (profilers.closed_loop.in_step)
    )

    def __post_init__(self) -> None:
        if self.acceptance not in VALIDATED_SCHEMES:
            raise PerfkitError(f"acceptance must be one of {', '.join(VALIDATED_SCHEMES)}, got {self.acceptance!r}")
        if self.drafter not in VALIDATED_DRAFTERS:
            raise PerfkitError(f"drafter must be one of {', '.join(VALIDATED_DRAFTERS)}, got {self.drafter!r}")
        if self.drafter == DrafterKind.EAGLE and (self.acceptance != "greedy" or self.dynamic):
            raise PerfkitError(
                "the EAGLE closed loop replays greedy steps over static trees: use --acceptance greedy, without "
                f"--dynamic (got --acceptance {self.acceptance}{' --dynamic' if self.dynamic else ''})"
            )
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


def batch_configs(batches, sizes=DEFAULT_SIZES, **settings) -> list[ValidateConfig]:
    """One closed loop's settings per distinct batch size, in the order given; `settings`:
    the other ValidateConfig fields, `sizes` any sequence of tree sizes."""
    return [ValidateConfig(batch=batch, sizes=tuple(sizes), **settings) for batch in dict.fromkeys(batches)]
