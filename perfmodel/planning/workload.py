"""What a deployment is asked to carry and to meet, one type each for every planner: the
workload (prompt and response length distributions, and for the serving simulation a request
rate or a trace of arrivals and lengths) and the targets (a per-token latency per user for the
unloaded capacity plan; time to first token and time per output token at a percentile for the
serving simulation; a throughput for both). The capacity plan (perfmodel.planning.capacity)
sizes memory for the p95 lengths and times steps at the mean context; the serving search
(perfmodel.serving.capacity) simulates the requests the workload samples."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.base.checks import is_count, is_real
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.lengths import DEFAULT_PROMPT_LEN, DEFAULT_RESPONSE_LEN, Lengths

# How many requests one simulation serves unless told: enough that the middle 80% (the
# steady state the percentiles are taken over) holds several hundred requests, few enough
# that a search over devices and degrees runs in seconds.
DEFAULT_REQUESTS = 600
PERCENTILES = (50, 90, 99)
TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
# 1.645 standard deviations above the mean of a normal is its 95th percentile.
Z95 = 1.6448536269514722


# Ceilings on what a deployment is asked to carry, far past any fleet's: beyond them the
# devices an answer needs leave the 64-bit integers its tables hold (a throughput of 1e30
# tokens/s ended in pandas' OverflowError; a rate of 1e30 requests/s planned 5.9e28 devices).
MAX_TOKENS_S = 1e12
MAX_RATE = 1e9


def positive(value, name: str, allow_none: bool = True, most: float = math.inf):
    if value is None and allow_none:
        return None
    if not is_real(value) or value <= 0:
        raise PerfkitError(f"{name} must be a positive number, got {value!r}")
    if value > most:
        raise PerfkitError(f"{name} must be at most {most:g}, got {value!r}")
    return float(value)


# The simulator's clock is float64 seconds from the first arrival: over a span T it resolves
# T x 2.2e-16 s. Its steps must stay resolved to a tenth of a microsecond, else a request's
# latency (finish - arrival) rounds to nothing.
CLOCK_RESOLUTION_S = 1e-7


def check_resolvable(rate: float, requests: int) -> None:
    """One line where `requests` arriving at `rate` per second span so long a time that the
    simulator's clock cannot resolve a step any more (its latencies would all read 0)."""
    span = requests / rate
    if span * np.finfo(float).eps > CLOCK_RESOLUTION_S:
        lowest = requests * np.finfo(float).eps / CLOCK_RESOLUTION_S
        raise PerfkitError(
            f"request rate {rate:g}/s is too low to simulate: {requests} requests would arrive over {span:.3g} s, "
            f"where the simulator's clock cannot resolve a step; give at least {lowest:.2g} requests/s"
        )


@dataclass(frozen=True)
class Targets:
    """What a deployment must meet (None: no target). ttft_s, tpot_s: time to first token and
    time per output token (seconds), each met by `percentile` percent of the serving
    simulation's requests; tokens_s: output tokens/s in all; latency_s: the unloaded capacity
    plan's per-token latency per user (seconds)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    percentile: int = 90
    tokens_s: float | None = None
    latency_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "latency_s"):
            positive(getattr(self, name), name)
        positive(self.tokens_s, "tokens_s", most=MAX_TOKENS_S)
        if self.percentile not in PERCENTILES:
            raise PerfkitError(
                f"percentile {self.percentile!r} is not offered; choose one of: {', '.join(map(str, PERCENTILES))}"
            )

    @property
    def simulated(self) -> bool:
        """Whether a target needs the serving simulation (a TTFT or TPOT percentile)."""
        return self.ttft_s is not None or self.tpot_s is not None

    def met(self, ttft_s: float, tpot_s: float) -> bool:
        """Whether latencies at the target percentile meet the targets set."""
        return (self.ttft_s is None or ttft_s <= self.ttft_s) and (self.tpot_s is None or tpot_s <= self.tpot_s)

    def serving(self) -> dict:
        """The targets the serving simulation holds to, by name (the unloaded latency_s aside)."""
        return {name: getattr(self, name) for name in ("ttft_s", "tpot_s", "percentile", "tokens_s")}

    def describe(self) -> str:
        """The serving simulation's targets in words."""
        parts = []
        if self.ttft_s is not None:
            parts.append(f"p{self.percentile} TTFT <= {self.ttft_s * 1e3:g} ms")
        if self.tpot_s is not None:
            parts.append(f"p{self.percentile} TPOT <= {self.tpot_s * 1e3:g} ms")
        if self.tokens_s is not None:
            parts.append(f">= {self.tokens_s:,.0f} output tokens/s")
        return ", ".join(parts) or "no latency target"


@dataclass(frozen=True)
class Requests:
    """Requests to serve, sorted by arrival: seconds since the first, and token counts;
    `gain`, where a request's own drafts are known, each one's tokens per decoding step as a
    multiple of what the serving costs say every sequence gains (None: 1 for all)."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    origin: str
    gain: np.ndarray | None = None

    def __post_init__(self) -> None:
        gain = self.gain
        if gain is not None and (len(gain) != len(self.arrival_s) or not np.all(np.isfinite(gain) & (gain > 0))):
            raise PerfkitError(
                f"request gains must be one positive number per request ({len(self.arrival_s)}), got {gain!r}"
            )

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def rate(self) -> float:
        """Requests per second over the span of the arrivals."""
        span = float(self.arrival_s[-1] - self.arrival_s[0])
        return (len(self) - 1) / span if span > 0 else math.inf

    def at_rate(self, rate: float) -> Requests:
        """The same requests in the same order, their arrival times scaled to `rate` per second."""
        positive(rate, "request rate", allow_none=False, most=MAX_RATE)
        scale = self.rate / rate if math.isfinite(self.rate) else 0.0
        origin = f"{self.origin}, at {rate:g} requests/s"
        return Requests(self.arrival_s * scale, self.prompt, self.output, origin, self.gain)


@dataclass(frozen=True)
class Workload:
    """What a deployment serves: prompt and response lengths (a mean and a p95 each). For the
    serving simulation, requests arrive as a Poisson process at `rate` per second with lengths
    drawn from log-normal distributions of that mean and p95 (a fixed length where the two are
    equal), or as a trace file's arrivals and lengths (`rate` rescales them); `requests` and
    `seed` size and fix the sample."""

    prompt: Lengths = Lengths(DEFAULT_PROMPT_LEN, DEFAULT_PROMPT_LEN)
    response: Lengths = Lengths(DEFAULT_RESPONSE_LEN, DEFAULT_RESPONSE_LEN)
    rate: float | None = None
    trace: Path | None = None
    requests: int = DEFAULT_REQUESTS
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt", "response"):
            if not isinstance(getattr(self, name), Lengths):
                raise PerfkitError(f"{name} must be a Lengths (Lengths.of(...) reads a count, pair or samples)")
        positive(self.rate, "request rate", most=MAX_RATE)
        if not is_count(self.requests, 10):
            raise PerfkitError(f"requests must be an integer >= 10 (a simulation's sample), got {self.requests!r}")
        if self.rate is not None:
            check_resolvable(self.rate, self.requests)

    @property
    def arrivals(self) -> bool:
        """Whether requests arrive (a rate or a trace): what the serving simulation needs."""
        return self.rate is not None or self.trace is not None

    @property
    def kv_tokens(self) -> int:
        """Tokens each sequence keeps in the KV cache: p95 prompt + p95 response."""
        return self.prompt.p95 + self.response.p95

    @property
    def step_context(self) -> int:
        """Context of the average decoding step: mean prompt + half the mean response."""
        return max(1, round(self.prompt.mean + self.response.mean / 2))

    def sample(self, rate: float | None = None) -> Requests:
        """The requests of one simulation: the trace's (at `rate` where given), else drawn at
        `rate` (default the workload's) with the workload's seed, so every configuration
        compared sees the same requests."""
        if self.trace is not None:
            requests = read_trace(self.trace)
            return requests if rate is None else requests.at_rate(rate)
        rate = positive(rate if rate is not None else self.rate, "request rate", allow_none=False)
        rng = np.random.default_rng(self.seed)
        gaps = rng.exponential(1.0, self.requests)
        arrivals = np.cumsum(gaps) - gaps[0]
        prompt = draw_lengths(self.prompt, self.requests, rng)
        output = draw_lengths(self.response, self.requests, rng)
        origin = f"{self.requests} Poisson arrivals at {rate:g}/s, prompts {self.prompt}, outputs {self.response}"
        return Requests(arrivals / rate, prompt, output, origin)

    def describe(self) -> str:
        if not self.arrivals:
            return f"prompts {self.prompt} tokens, responses {self.response} tokens"
        if self.trace is not None:
            return f"trace {self.trace}" + (f" at {self.rate:g} requests/s" if self.rate else "")
        return f"{self.rate:g} requests/s, prompts {self.prompt} tokens, outputs {self.response} tokens"


def lognormal_sigma(lengths: Lengths) -> float:
    """The log-normal's sigma whose mean and 95th percentile are the given ones: the smaller
    root of sigma^2/2 - z95 sigma + ln(p95/mean) = 0. A p95 beyond e^(z95^2/2) = 3.87 x the
    mean has none: that tail is heavier than a log-normal's, and is an error."""
    ratio = lengths.p95 / lengths.mean
    if ratio <= 1:
        return 0.0
    disc = Z95**2 - 2 * math.log(ratio)
    if disc < 0:
        raise PerfkitError(
            f"a p95 of {lengths.p95} is {ratio:.1f}x the mean {lengths.mean:g}: no log-normal has a tail that heavy "
            "(at most 3.87x); give samples or a trace instead"
        )
    return Z95 - math.sqrt(disc)


def draw_lengths(lengths: Lengths, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` token counts >= 1 from the log-normal of `lengths`' mean and p95."""
    sigma = lognormal_sigma(lengths)
    mu = math.log(lengths.mean) - sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, count))).astype(np.int64)


def read_trace(path: str | Path) -> Requests:
    """A CSV trace: one request per row with arrival_s (seconds, any origin), prompt_tokens and
    output_tokens; rows are sorted by arrival."""
    path = Path(path)
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise PerfkitError(f"cannot read trace {path}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"cannot read trace {path}: {exc}".splitlines()[0]) from None
    missing = [c for c in TRACE_COLUMNS if c not in frame.columns]
    if missing:
        raise PerfkitError(f"trace {path} lacks column(s) {', '.join(missing)}; a trace has {', '.join(TRACE_COLUMNS)}")
    if len(frame) < 10:
        raise PerfkitError(f"trace {path} holds {len(frame)} request(s); a simulation needs at least 10")
    values = frame[list(TRACE_COLUMNS)].apply(pd.to_numeric, errors="coerce")
    bad = values.isna().any(axis=1) | (values["prompt_tokens"] < 1) | (values["output_tokens"] < 1)
    bad |= values["arrival_s"] < 0
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise PerfkitError(
            f"trace {path}, row {row + 2}: {frame.iloc[row][list(TRACE_COLUMNS)].to_dict()}; arrival_s must be a "
            "number >= 0 and token counts integers >= 1"
        )
    values = values.sort_values("arrival_s", kind="stable")
    arrivals = values["arrival_s"].to_numpy(float)
    return Requests(
        arrivals - arrivals[0],
        values["prompt_tokens"].to_numpy(np.int64),
        values["output_tokens"].to_numpy(np.int64),
        f"trace {path.name} ({len(values)} requests)",
    )
