"""Requests played against the engine at their arrival times, each a streamed completion
of exactly its prompt's token ids and its output length (greedy, end-of-sequence ignored),
every token's arrival recorded: the measured side of the serving check.

The requests are perfmodel.planning.workload.Requests, the type the serving simulation
serves, so both see the same arrivals and lengths. asyncio and
aiohttp's client (the engine's own benchmark uses it): one thread holds every open request,
and the client takes little of a two-core machine from the engine (httpx's async client,
tried first, fell 0.4 s behind its arrival times at 15 requests/s and reported 2.6 s where
the engine's own benchmark measured 15 ms). Everything is bounded: a request is abandoned after `request_timeout_s`, the
whole load after the last arrival plus `drain_timeout_s`."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from dataclasses import dataclass

import aiohttp
import numpy as np
import pandas as pd

from perfmodel.planning.workload import Requests

REQUEST_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 600.0
FIRST_ORDINARY_TOKEN = 4  # ids below are the tokenizer's specials (end of sequence among them)


@dataclass(frozen=True)
class Played:
    """One request as the client saw it; times in seconds from the load's start."""

    index: int
    arrival_s: float  # when it was due
    sent_s: float
    token_s: tuple[float, ...]  # arrival of each output token (several per chunk share a time)
    prompt: int
    output: int  # tokens asked for
    error: str = ""

    @property
    def received(self) -> int:
        return len(self.token_s)


def prompt_ids(index: int, length: int, vocab: int, seed: int) -> list[int]:
    """A prompt of `length` ordinary token ids, the same for a request index and seed (no
    two prompts share a prefix, so nothing could be served from a prefix cache)."""
    rng = np.random.default_rng([seed, index])
    return rng.integers(FIRST_ORDINARY_TOKEN, vocab, length).tolist()


def request_prompts(lengths, vocab: int, seed: int) -> list[list[int]]:
    """The prompts of a run's requests, in order: what the engine is sent, and what the
    project's decoder drafts on to set its acceptance beside the engine's."""
    return [prompt_ids(i, int(n), vocab, seed) for i, n in enumerate(lengths)]


def body(model: str, ids: list[int], output: int) -> dict:
    return {
        "model": model,
        "prompt": ids,
        "max_tokens": output,
        "min_tokens": output,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


def tokens_in(chunk: dict) -> int:
    """Output tokens a streamed chunk carries (its token ids; one where it has text but no ids)."""
    count = 0
    for choice in chunk.get("choices") or []:
        ids = choice.get("token_ids")
        count += len(ids) if ids else (1 if choice.get("text") else 0)
    return count


async def stream_tokens(client, url, request: dict, start: float, times: list[float]) -> str:
    """Stream one completion, appending each token's arrival to `times`; an error's text or ''."""
    async with client.post(f"{url}/v1/completions", json=request) as reply:
        if reply.status != 200:
            return f"HTTP {reply.status}: {(await reply.text())[:200]}"
        async for raw in reply.content:
            line = raw.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                now = time.perf_counter() - start
                times += [now] * tokens_in(json.loads(line[6:]))
    return ""


async def play_one(client, url, request: dict, index: int, arrival: float, start: float, timeout: float) -> Played:
    await asyncio.sleep(max(0.0, start + arrival - time.perf_counter()))
    sent = time.perf_counter() - start
    times: list[float] = []
    try:
        error = await asyncio.wait_for(stream_tokens(client, url, request, start, times), timeout)
    except asyncio.TimeoutError:
        error = f"no answer within {timeout:.0f} s"
    except aiohttp.ClientError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Played(index, arrival, sent, tuple(times), len(request["prompt"]), request["max_tokens"], error)


async def play_all(url, model, requests: Requests, vocab, seed, timeout, drain) -> list[Played]:
    # No cap on open requests (the engine queues them), and a connection per request: a kept-alive
    # one that the server closed after its idle timeout failed the next request sent on it.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as client:
        prompts = request_prompts(requests.prompt, vocab, seed)
        bodies = [body(model, ids, int(o)) for ids, o in zip(prompts, requests.output)]
        start = time.perf_counter()
        tasks = [
            asyncio.create_task(play_one(client, url, bodies[i], i, float(a), start, timeout))
            for i, a in enumerate(requests.arrival_s)
        ]
        done, pending = await asyncio.wait(tasks, timeout=float(requests.arrival_s[-1]) + drain)
        for task in pending:
            task.cancel()
        played = [t.result() for t in done]
        missing = sorted(set(range(len(requests))) - {p.index for p in played})
        played += [
            Played(
                i,
                float(requests.arrival_s[i]),
                float("nan"),
                (),
                int(requests.prompt[i]),
                int(requests.output[i]),
                f"unfinished when the load's {drain:.0f} s drain ended",
            )
            for i in missing
        ]
    return sorted(played, key=lambda p: p.index)


def play(
    url: str,
    model: str,
    requests: Requests,
    vocab: int,
    seed: int = 0,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
) -> list[Played]:
    """Play `requests` against the server at `url`; one Played per request, in order. The
    garbage collector is off while they play: a full collection in a process holding torch
    and pandas pauses the event loop that sends the requests and timestamps the tokens."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        return asyncio.run(play_all(url, model, requests, vocab, seed, request_timeout_s, drain_timeout_s))
    finally:
        gc.enable()
        gc.unfreeze()


def request_rows(played: list[Played]) -> pd.DataFrame:
    """Per request: arrival, send, first token and finish times, TTFT, TPOT (the decode's
    seconds per token after the first), end-to-end latency, and the mean and largest gap
    between streamed tokens (ITL)."""
    rows = []
    for p in played:
        t = np.asarray(p.token_s, dtype=float)
        gaps = np.diff(t)
        complete = not p.error and p.received == p.output
        first = t[0] if t.size else np.nan
        finish = t[-1] if t.size else np.nan
        rows.append(
            {
                "request": p.index,
                "arrival_s": p.arrival_s,
                "sent_s": p.sent_s,
                "first_token_s": first,
                "finish_s": finish,
                "prompt": p.prompt,
                "output": p.output,
                "received": p.received,
                "ttft_s": first - p.arrival_s,
                "tpot_s": (finish - first) / (p.received - 1) if p.received > 1 else np.nan,
                "e2e_s": finish - p.arrival_s,
                "itl_mean_s": float(gaps.mean()) if gaps.size else np.nan,
                "itl_max_s": float(gaps.max()) if gaps.size else np.nan,
                "complete": complete,
                "error": p.error,
            }
        )
    return pd.DataFrame(rows)
