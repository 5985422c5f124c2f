"""Step costs measured through the engine alone, never through the load runs they predict:

- decoding: `batch` requests sent together, each a prompt of `prompt` tokens and `output`
  tokens; once every one has its first token and before the first finishes, each iteration
  decodes exactly `batch` sequences, and the median gap between their streamed tokens is the
  engine's step at that batch and context (scheduler, model, sampling, detokenizing and
  streaming included: all the server does per iteration); a speculating engine streams each
  iteration's accepted tokens together as one chunk, so the gap is per token, the median
  gap between chunks is the iteration (kind decode's iteration_s), and its drafts and
  accepted tokens over the point's requests (/metrics before and after) its tokens per step;
- prefill: one request of `length` prompt tokens and one output token, alone on the server;
  its time to first token is the prefill of that length as a client sees it;
- mixed: the same one-token requests sent while `batch` others decode; the iteration that
  prefills one is longer than its neighbours by what prefilling `length` tokens adds to a
  decoding step (kind mixed), and their time to first token there is kind mixed-ttft.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.planning.workload import Requests
from profilers.engine.load import play
from profilers.engine.scrape import scrape, speculation_counts

DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_PROMPTS = (64, 512)  # two contexts: the step's slope in context between them
DECODE_OUTPUT = 96
DECODE_REPEATS = 3  # each point's repeats taken in turn with the others', so a drifting machine moves all alike
PREFILL_LENGTHS = (1, 16, 32, 64, 128, 256, 512, 768)
PREFILL_REPEATS = 5
MIXED_BATCH = 4
MIXED_PROBES = 5
MIXED_SPACING_S = 0.12  # between probes: several decoding steps apart


@dataclass(frozen=True)
class StepSweep:
    batches: tuple[int, ...] = DECODE_BATCHES
    prompts: tuple[int, ...] = DECODE_PROMPTS
    output: int = DECODE_OUTPUT
    decode_repeats: int = DECODE_REPEATS
    prefill_lengths: tuple[int, ...] = PREFILL_LENGTHS
    prefill_repeats: int = PREFILL_REPEATS
    mixed_batch: int = MIXED_BATCH
    mixed_probes: int = MIXED_PROBES


def together(count: int, prompt: int, output: int) -> Requests:
    n = np.full(count, 1)
    return Requests(np.zeros(count), n * prompt, n * output, f"{count} requests at once")


def decode_point(url: str, model: str, vocab: int, batch: int, prompt: int, output: int, seed: int) -> dict:
    before = scrape(url)
    played = play(url, model, together(batch, prompt, output), vocab, seed=seed)
    counted = speculation_counts(scrape(url), before)
    failed = [p.error for p in played if p.error]
    if failed:
        raise PerfkitError(f"decode sweep at batch {batch}: {failed[0]}")
    start = max(p.token_s[0] for p in played)
    end = min(p.token_s[-1] for p in played)
    steps, iterations, contexts = [], [], []
    for p in played:
        t = np.asarray(p.token_s)
        inside = np.flatnonzero((t >= start) & (t <= end))
        if inside.size > 1:
            # A span over many tokens, not single gaps: streamed lines can arrive in bursts.
            span = t[inside[-1]] - t[inside[0]]
            steps.append(span / (inside[-1] - inside[0]))
            chunks = len(np.unique(t[inside]))  # a chunk's tokens share its arrival
            iterations.append(span / (chunks - 1) if chunks > 1 else np.nan)
            contexts.append(prompt + 1 + inside.mean())
    steps = np.asarray(steps)
    return {
        "kind": "decode",
        "batch": batch,
        "tokens": prompt,
        "context": float(np.mean(contexts)) if contexts else float(prompt),
        "step_s": float(np.median(steps)) if steps.size else float("nan"),
        "iqr_s": float(np.subtract(*np.percentile(steps, [75, 25]))) if steps.size else float("nan"),
        "samples": int(steps.size),
        # a speculating engine's drafts over the point's requests and the tokens accepted
        "drafts": counted["drafts"],
        "accepted": sum(counted["accepted_per_position"]),
        "iteration_s": float(np.nanmedian(iterations)) if np.isfinite(iterations).any() else float("nan"),
    }


def prefill_point(url: str, model: str, vocab: int, length: int, repeats: int, seed: int) -> dict:
    ttfts = []
    for r in range(repeats):
        (p,) = play(url, model, together(1, length, 1), vocab, seed=seed + r)
        if p.error:
            raise PerfkitError(f"prefill sweep at {length} tokens: {p.error}")
        ttfts.append(p.token_s[0] - p.sent_s)
    return {
        "kind": "prefill",
        "batch": 1,
        "tokens": length,
        "context": float(length),
        "step_s": float(np.median(ttfts)),
        "iqr_s": float(np.subtract(*np.percentile(ttfts, [75, 25]))),
        "samples": repeats,
    }


def mixed_point(url: str, model: str, vocab: int, batch: int, length: int, probes: int, seed: int) -> dict:
    first = 0.1  # the decoding requests have their first tokens by then
    arrivals = np.concatenate([np.zeros(batch), first + MIXED_SPACING_S * np.arange(probes)])
    steps_needed = int((first + MIXED_SPACING_S * probes) / 1e-3)  # outlast the probes at 1 ms a step
    prompts = np.concatenate([np.full(batch, 64), np.full(probes, length)])
    outputs = np.concatenate([np.full(batch, steps_needed), np.ones(probes, dtype=int)])
    played = play(url, model, Requests(arrivals, prompts, outputs, "mixed"), vocab, seed=seed)
    failed = [p.error for p in played if p.error]
    if failed:
        raise PerfkitError(f"mixed sweep at {length} tokens: {failed[0]}")
    streams = [np.asarray(p.token_s) for p in played[:batch]]
    probe_times = [p.token_s[0] for p in played[batch:]]
    if any(t >= min(s[-1] for s in streams) for t in probe_times):
        raise PerfkitError(f"mixed sweep at {length} tokens: the decoding requests finished before the probes")
    lengthened = []
    for t in probe_times:
        gaps = []
        for stream in streams:
            k = int(np.argmin(np.abs(stream - t)))  # the same iteration's token
            gaps.append(stream[k] - stream[k - 1])
        lengthened.append(float(np.median(gaps)))
    usual = np.median(np.diff(streams[0])[np.diff(streams[0]) > 0])
    added = np.asarray(lengthened) - usual
    ttft = np.asarray([p.token_s[0] - p.sent_s for p in played[batch:]])
    common = {"batch": batch, "tokens": length, "context": float(length), "samples": probes}
    return [
        {"kind": "mixed", **common, "step_s": float(np.median(added)), "iqr_s": iqr(added)},
        {"kind": "mixed-ttft", **common, "step_s": float(np.median(ttft)), "iqr_s": iqr(ttft)},
    ]


def iqr(values: np.ndarray) -> float:
    return float(np.subtract(*np.percentile(values, [75, 25])))


def sweep_steps(
    url: str, model: str, vocab: int, sweep: StepSweep, max_seqs: int, progress: Callable[[str], None] = print
) -> pd.DataFrame:
    """Prefill and decoding steps on a running server, as rows (see the module doc)."""
    rows = []
    decode_point(url, model, vocab, min(4, max_seqs), sweep.prompts[0], sweep.output, seed=1)  # warm-up, dropped
    for length in sweep.prefill_lengths:
        rows.append(prefill_point(url, model, vocab, length, sweep.prefill_repeats, seed=10_000 + length))
        progress(f"prefill {length:>5} tokens: {rows[-1]['step_s'] * 1e3:7.2f} ms")
    mixed_batch = min(sweep.mixed_batch, max_seqs - 1)
    for length in (n for n in sweep.prefill_lengths if n > 1 and mixed_batch >= 1):
        rows += mixed_point(url, model, vocab, mixed_batch, length, sweep.mixed_probes, seed=30_000 + length)
        added, ttft = rows[-2]["step_s"] * 1e3, rows[-1]["step_s"] * 1e3
        said = f"{added:+6.2f} ms a step, TTFT {ttft:.2f} ms"
        progress(f"prefill {length:>5} tokens beside {mixed_batch} decoding: {said}")
    for repeat in range(sweep.decode_repeats):
        for prompt in sweep.prompts:
            for batch in (b for b in sweep.batches if b <= max_seqs):
                seed = 20_000 + 1000 * repeat + prompt + batch
                rows.append(decode_point(url, model, vocab, batch, prompt, sweep.output, seed=seed))
                row = rows[-1]
                progress(f"decode batch {batch:>3} at {row['context']:6.0f} tokens: {row['step_s'] * 1e3:7.2f} ms")
    return pd.DataFrame(rows)
