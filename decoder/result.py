"""What a decoding run returns, and how accepted tokens are emitted into it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from decoder.model import KVCache

# Where an eager Medusa step's time goes (timed per step); not the operator phases prefill/decode/tree.
STEP_PARTS = ("candidates", "forward", "verification", "kv_update")


@dataclass(frozen=True)
class Emission:
    """Where each sequence's tokens stop (its budget, an end-of-sequence token) and who hears them as they come."""

    max_new_tokens: int
    eos: int | None = None
    on_tokens: Callable[[int, list[int]], object] | None = None  # on_tokens(batch_index, tokens): streaming


@dataclass
class DecodeResult:
    tokens: list[list[int]]  # new tokens of each sequence
    accepted: list[list[int]]  # tokens accepted at each step, per sequence
    tree_sizes: list[int]  # tokens processed per step (tree size)
    # tokens of each step's accepted path, per sequence, root included, before the cut at the
    # token budget: what a replay (decoder.twin) needs to do the same work again
    path_lengths: list[list[int]] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_PARTS, 0.0))
    prefill_s: float = 0.0
    # a static step's warm-up between the prefill and the timed steps (a CUDA graph's capture, a
    # compilation, an eager step undone: decoder.static_step), in neither prefill_s nor decode_s
    warmup_s: float = 0.0
    decode_s: float = 0.0
    cache: KVCache | None = None  # the final cache, slots [0, cache_lengths[b]) valid
    cache_lengths: list[int] | None = None

    @classmethod
    def empty(cls, batch: int) -> DecodeResult:
        return cls([[] for _ in range(batch)], [[] for _ in range(batch)], [], path_lengths=[[] for _ in range(batch)])

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def steps(self) -> int:
        return len(self.tree_sizes)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s else float("nan")

    def emit(self, row: int, new: list[int], emission: Emission) -> bool:
        """Append sequence `row`'s accepted tokens, cut at its token budget and after an
        end-of-sequence token, stream them to `on_tokens(row, tokens)`; whether it is done."""
        eos = emission.eos
        room = emission.max_new_tokens - len(self.tokens[row])
        if eos is not None and eos in new[:room]:
            room = new.index(eos) + 1
        new = new[:room]
        self.tokens[row] += new
        self.accepted[row].append(len(new))
        if emission.on_tokens is not None:
            emission.on_tokens(row, new)
        return len(self.tokens[row]) >= emission.max_new_tokens or (eos is not None and new[-1:] == [eos])
