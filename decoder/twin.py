"""A performance twin: the reference decoder over any config.json with dummy weights,
replaying the acceptance a real run recorded.

A step's time depends on the kernels it launches and the bytes they stream, not on the
weights' values; so a model of real size runs without its checkpoint, as serving engines'
dummy load format does (vLLM's `--load-format dummy` fills every weight uniformly in
[-1e-3, 1e-3]). Dummy heads guess nothing, so on its own a twin would accept only the root
every step; a `Replay` makes every step do the full verification work of the scheme and then
keep a path as long as the one the real run accepted at that step (decoder.measure records
them as `path_lengths`), so the twin's steps are the real run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from decoder.checkpoint import Checkpoint
from decoder.heads import MedusaHeads
from decoder.model import LlamaConfig, Transformer
from decoder.trace_ops import NO_KERNEL, dtype_name, op_name, shapes_text, tensors_in
from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.acceptance.trees import Tree, greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import DEFAULT_MEDUSA_HEADS, resolve_model_path
from perfmodel.models.hf_config import read_config_json, read_hf_config
from perfmodel.models.unpriced import check_runs_dense

DUMMY_RANGE = 1e-3  # vLLM's dummy weights: uniform in [-1e-3, 1e-3]


def dummy_checkpoint(
    model: str | Path,
    dtype: torch.dtype = torch.float32,
    medusa_heads: int | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> Checkpoint:
    """A checkpoint of `model`'s config.json (a file or folder; `bundled`) with dummy weights
    and `medusa_heads` heads (default: the config's, else DEFAULT_MEDUSA_HEADS), on `device`.
    Built on the meta device, cast, and filled in place where it lives, so a 1B model is
    ready in seconds, not after minutes of per-layer random initialisation, and a 7B one
    never passes through host memory in fp32."""
    path = resolve_model_path(model)
    if path is None:
        raise PerfkitError(f"--weights dummy needs a config.json: {model!r} is not a file or folder")
    check_runs_dense(read_config_json(path), path, "the reference decoder")
    config = LlamaConfig.from_hf(read_hf_config(path))
    return dummy_checkpoint_of(config, path if path.is_dir() else path.parent, dtype, medusa_heads, seed, device)


def dummy_checkpoint_of(
    config: LlamaConfig,
    folder: Path | None = None,
    dtype: torch.dtype = torch.float32,
    medusa_heads: int | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> Checkpoint:
    """dummy_checkpoint of a config already read (`folder`: where it came from, if anywhere)."""
    heads = medusa_heads if medusa_heads is not None else (config.medusa_num_heads or DEFAULT_MEDUSA_HEADS)
    if heads < 1:
        raise PerfkitError(f"a twin needs Medusa heads to draft with: got {heads}")
    with torch.device("meta"):
        net = Transformer(config)
        medusa = MedusaHeads(config.hidden_size, config.vocab_size, heads)
    generator = torch.Generator(device=device).manual_seed(seed)
    net, medusa = (_filled(m.to(dtype).to_empty(device=device), generator).eval() for m in (net, medusa))
    return Checkpoint(folder, config, net, medusa, None, None, {"weights": "dummy", "dummy_range": DUMMY_RANGE})


def native_dtype() -> str:
    """bf16 where this CPU multiplies it natively (AVX-512 BF16 or AMX, through oneDNN), else
    fp32: the twin's default on a CPU."""
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"


def _filled(module: torch.nn.Module, generator: torch.Generator) -> torch.nn.Module:
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            tensor.uniform_(-DUMMY_RANGE, DUMMY_RANGE, generator=generator)
    return module


def random_prompts(vocab_size: int, count: int, length: int, seed: int) -> list[list[int]]:
    """Prompts of random token ids: a twin has no tokenizer, and a step's work does not
    depend on which tokens it reads."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, vocab_size, size=(count, length)).tolist()


@dataclass
class Replay:
    """The accepted path lengths a real run recorded for one tree, per sequence, handed out
    a batch at a time in order (wrapping around), each sequence's lengths replayed step by
    step (wrapping around where the twin decodes longer than the record did)."""

    lengths: list[list[int]]
    _next: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not self.lengths or not all(self.lengths):
            raise PerfkitError("a replay needs at least one sequence with at least one step")

    def take(self, batch: int) -> list[list[int]]:
        out = [self.lengths[(self._next + i) % len(self.lengths)] for i in range(batch)]
        self._next = (self._next + batch) % len(self.lengths)
        return out

    def steps(self, batch: int, new_tokens: int, batches: int) -> int:
        """Steps `batches` batches of `batch` sequences take to emit `new_tokens` each, as
        Decoder.generate runs them: a batch steps until its slowest sequence is done."""
        total, start = 0, 0
        for _ in range(batches):
            rows = [self.lengths[(start + i) % len(self.lengths)] for i in range(batch)]
            total += max(steps_to(row, new_tokens) for row in rows)
            start = (start + batch) % len(self.lengths)
        return total


def steps_to(lengths: list[int], new_tokens: int) -> int:
    """Steps a sequence replaying `lengths` (wrapping) takes to emit `new_tokens`."""
    emitted, steps = 0, 0
    while emitted < new_tokens:
        emitted += lengths[steps % len(lengths)]
        steps += 1
    return steps


@dataclass(frozen=True)
class ReplayRecord:
    """What a twin replays from a decoder.measure record: the heads' accuracies (which
    choose each size's tree, as the real run chose them) and each tree size's path lengths."""

    accuracy: np.ndarray
    path_lengths: dict[int, list[list[int]]]
    source: str

    @classmethod
    def load(cls, path: str | Path) -> ReplayRecord:
        record = AcceptanceRecord.load(path)
        runs = {run.tree_size: run.path_lengths for run in record.per_tree_size if run.path_lengths}
        if not runs:
            raise PerfkitError(
                f"{path}: no path_lengths to replay; write the record again with python -m decoder.measure"
            )
        return cls(record.accuracy, {size: [list(r) for r in rows] for size, rows in runs.items()}, str(path))

    @property
    def sizes(self) -> list[int]:
        return sorted(self.path_lengths)

    def tree(self, size: int) -> Tree:
        """The tree the recorded run used at this size (decoder.measure: the greedy tree of
        the heads' accuracies)."""
        self._check(size)
        return greedy_tree(self.accuracy, size - 1)

    def replay(self, size: int) -> Replay:
        self._check(size)
        return Replay(self.path_lengths[size])

    def _check(self, size: int) -> None:
        if size not in self.path_lengths:
            raise PerfkitError(
                f"{self.source} records no run with a {size}-token tree; it has {', '.join(map(str, self.sizes))}"
            )


class KernelList(TorchDispatchMode):
    """The kernels a run on real tensors executes, in order, as (operator, input shapes,
    output dtype): views and allocations, which launch no kernel (decoder.trace_ops.NO_KERNEL),
    are left out. Two runs that do the same work give equal lists."""

    def __init__(self):
        super().__init__()
        self.kernels: list[tuple[str, str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in NO_KERNEL:
            outputs = tensors_in(out)
            dtype = dtype_name(outputs[0].dtype) if outputs else ""
            self.kernels.append((op_name(func), shapes_text(tensors_in((args, kwargs))), dtype))
        return out
