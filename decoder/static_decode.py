"""Decoding prompts with the static step (decoder.static_step): the prefill, the step's
warm-up, then step after step, each followed by the host's one read of the step's verdict
(each sequence's accepted length and tokens) to stream tokens and stop finished sequences.

A graph or compiled step is kept per shape on the decoder and reused by later calls; the
warm-up runs once per kept step, at the timed shape, and is timed apart (the result's
warmup_s), in neither prefill_s nor decode_s.
"""

from __future__ import annotations

import time

import torch

from decoder.acceptance import AcceptanceConfig
from decoder.result import DecodeResult, Emission
from decoder.static_step import Execution, StaticStep
from decoder.tree import Drafting, TreeBuffers
from perfmodel.base.launch import Launch

# Where a static step's time goes: the step on the device, and the host's read of its verdict
# with the bookkeeping after it (streaming, stopping finished sequences).
STATIC_PARTS = ("step", "readback")


def static_generate(
    decoder,
    prompts: list[list[int]],
    emission: Emission,
    buffers: TreeBuffers,
    acceptance: AcceptanceConfig,
    drafting: Drafting,
    launch: Launch,
    replayed: list[list[int]] | None = None,
) -> DecodeResult:
    """Decode `prompts` with the static step over the tree of `buffers`, drafted by
    `drafting.drafter` (Medusa's heads, or the EAGLE drafter)."""
    batch, device = len(prompts), decoder.device
    max_len = decoder._max_len(prompts, emission.max_new_tokens, buffers.size)
    generator = torch.Generator(device=device).manual_seed(acceptance.seed)
    key = (buffers.tree, batch, max_len, acceptance, drafting.topk, launch, drafting.drafter)
    step = decoder._static_steps.get(key)
    if step is None:
        step = StaticStep(decoder, buffers, batch, max_len, acceptance, drafting, Execution(launch), generator)
        if launch in (Launch.GRAPH, Launch.COMPILED):
            # kept per shape, so that a captured graph or a compiled step is reused across calls
            # (their results' caches are then that step's, overwritten by the next call)
            decoder._static_steps[key] = step
    else:
        step.generator.manual_seed(acceptance.seed)
    result = DecodeResult.empty(batch)
    result.times = dict.fromkeys(STATIC_PARTS, 0.0)
    done = [False] * batch
    with torch.inference_mode():
        started = time.perf_counter()
        step.start(decoder, prompts)
        decoder._sync()
        result.prefill_s = time.perf_counter() - started
        if not step.warm:  # at the timed shape, in the prefilled state; a kept step is warm from its first call
            started = time.perf_counter()
            step.warm_up()
            decoder._sync()
            result.warmup_s = time.perf_counter() - started
        started = time.perf_counter()
        while not all(done):
            if replayed is not None:
                at = [replayed[b][len(result.path_lengths[b]) % len(replayed[b])] for b in range(batch)]
                step.buffers.forced.copy_(torch.tensor(at), non_blocking=False)
            t0 = time.perf_counter()
            step()
            decoder._sync()
            t1 = time.perf_counter()
            rows = step.buffers.out.tolist()
            finished = False
            for b, row in enumerate(rows):
                if done[b]:
                    continue
                length = row[0]
                result.path_lengths[b].append(length)
                done[b] = result.emit(b, row[1 : 1 + length], emission)
                finished |= done[b]
            if finished:
                step.buffers.active.copy_(torch.tensor([not d for d in done]))
            result.tree_sizes.append(buffers.size)
            result.times["step"] += t1 - t0
            result.times["readback"] += time.perf_counter() - t1
        result.decode_s = time.perf_counter() - started
    result.cache, result.cache_lengths = step.buffers.cache, step.buffers.lengths.tolist()
    return result
