"""A load run against a running engine: a rate's requests (drawn by the workload the
simulation draws them with) played, and from /metrics before and after it the engine's
iterations by tokens scheduled (its histogram: the batch each iteration ran), its
preemptions and, speculating, its drafts and the tokens accepted at each draft position.
/metrics is not sampled during the run: rendering the page holds the engine's API server,
and sampling it every 50-250 ms made the server stream its tokens in bursts."""

from __future__ import annotations

import json
import time

import numpy as np

from perfmodel.planning.workload import Workload
from profilers.engine.load import play, request_rows
from profilers.engine.scrape import histogram_counts, scrape, speculation_counts, value


def load_run(url: str, model: str, vocab: int, workload: Workload, rate: float, seed: int) -> dict:
    """One rate: its requests, every token's arrival, and the engine's counters over the run."""
    requests = workload.sample(rate)
    before = scrape(url)
    started = time.perf_counter()
    played = play(url, model, requests, vocab, seed=seed)
    wall = time.perf_counter() - started
    after = scrape(url)
    counted = speculation_counts(after, before)
    return {
        "requests": request_rows(played),
        "token_times": np.concatenate([np.asarray(p.token_s, dtype=float) for p in played]),
        "iteration_tokens": histogram_counts(after, before, "iteration_tokens_total"),
        "preemptions": int(value(after, "num_preemptions_total") - value(before, "num_preemptions_total")),
        "speculation": {**counted, "accepted_per_position": json.dumps(counted["accepted_per_position"])},
        "wall_s": wall,
    }
