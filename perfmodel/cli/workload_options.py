"""The options of a workload, declared once as the fields of WorkloadOptions (the parser is
generated from them, perfmodel.cli.fields): what a deployment serves and must meet (lengths, a
request rate or trace, latency targets), the Medusa setting and how the engine schedules. A
command reads them back as WorkloadSettings: the one Workload, its Targets and the engine.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.cli.fields import add_options, option
from perfmodel.cli.parser import positive_int, positive_number
from perfmodel.planning.lengths import DEFAULT_PROMPT_LEN, DEFAULT_RESPONSE_LEN, Lengths
from perfmodel.planning.medusa_setting import MEDUSA_MODES
from perfmodel.planning.workload import PERCENTILES, Targets, Workload
from perfmodel.serving.simulator import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_SEQS, PREFILL_MODES, EngineConfig

Target = argparse._ActionsContainer  # a parser or a (mutually exclusive) group of one


def lengths_option(flag: str, what: str, default: int) -> dict:
    return option(
        flag,
        f"{what} tokens: MEAN [P95] (default {default}; the KV cache is sized for the p95)",
        nargs="+",
        type=positive_number,
        metavar="TOKENS",
    )


MEDUSA = option(
    "--medusa",
    "; ".join(f"{name} = {meaning}" for name, meaning in MEDUSA_MODES.items()) + " (default auto)",
    choices=tuple(MEDUSA_MODES),
)


@dataclass(frozen=True)
class MedusaOptions:
    """The Medusa setting alone, for a command that takes no workload (the schedule)."""

    medusa: str = field(default="auto", metadata=MEDUSA)


@dataclass(frozen=True)
class WorkloadOptions:
    """What workload options a command line gave, as parsed (read back by settings())."""

    prompt_len: tuple[float, ...] = field(
        default=(DEFAULT_PROMPT_LEN,), metadata=lengths_option("--prompt-len", "prompt", DEFAULT_PROMPT_LEN)
    )
    response_len: tuple[float, ...] = field(
        default=(DEFAULT_RESPONSE_LEN,), metadata=lengths_option("--response-len", "response", DEFAULT_RESPONSE_LEN)
    )
    latency_ms: float | None = field(
        default=None,
        metadata=option(
            "--latency-ms", "per-token latency target per user, in ms (unloaded)", type=positive_number, metavar="MS"
        ),
    )
    rate: float | None = field(
        default=None,
        metadata=option(
            "--rate", "requests per second to serve: runs the serving simulation", type=positive_number, metavar="REQ_S"
        ),
    )
    trace: Path | None = field(
        default=None,
        metadata=option(
            "--trace",
            "a request trace (arrival_s, prompt_tokens, output_tokens per row) to simulate instead of Poisson "
            "arrivals; --rate rescales its arrivals",
            type=Path,
            metavar="CSV",
        ),
    )
    ttft_ms: float | None = field(
        default=None,
        metadata=option("--ttft-ms", "time-to-first-token target, in ms", type=positive_number, metavar="MS"),
    )
    tpot_ms: float | None = field(
        default=None,
        metadata=option("--tpot-ms", "time-per-output-token target, in ms", type=positive_number, metavar="MS"),
    )
    percentile: int = field(
        default=90,
        metadata=option(
            "--percentile",
            "the percentile of requests the TTFT and TPOT targets hold for (default %(default)s)",
            type=int,
            choices=PERCENTILES,
        ),
    )
    medusa: str = field(default="auto", metadata=MEDUSA)
    prefill: str = field(
        default="separate",
        metadata=option(
            "--prefill",
            "how the simulated engine prefills: separate iterations (vLLM v0, TGI) or chunked into decoding "
            "iterations up to --chunk-tokens (vLLM v1, SGLang) (default %(default)s)",
            choices=PREFILL_MODES,
        ),
    )
    chunk_tokens: int = field(
        default=DEFAULT_CHUNK_TOKENS,
        metadata=option(
            "--chunk-tokens",
            "tokens per iteration with --prefill chunked, the step's own tokens included (default %(default)s)",
            type=positive_int,
            metavar="TOKENS",
        ),
    )
    max_seqs: int = field(
        default=DEFAULT_MAX_SEQS,
        metadata=option(
            "--max-seqs",
            "the simulated engine's cap on running sequences, as vLLM's max_num_seqs (default %(default)s; the KV "
            "cache may hold fewer)",
            type=positive_int,
            metavar="N",
        ),
    )

    def settings(self, throughput: float | None = None) -> WorkloadSettings:
        """The workload, targets (`throughput`: output tokens/s in all, where the command takes
        it) and engine these options give; bad values are one-line errors."""
        workload = Workload(
            lengths_arg(self.prompt_len, "--prompt-len"),
            lengths_arg(self.response_len, "--response-len"),
            self.rate,
            self.trace,
        )
        targets = Targets(
            seconds(self.ttft_ms), seconds(self.tpot_ms), self.percentile, throughput, seconds(self.latency_ms)
        )
        if targets.simulated and not workload.arrivals and throughput is None:
            raise PerfkitError("--ttft-ms and --tpot-ms need a load to hold at: give --rate, --trace or --throughput")
        engine = EngineConfig(self.prefill, self.chunk_tokens, self.max_seqs)
        return WorkloadSettings(workload, targets, engine, self.medusa)


@dataclass(frozen=True)
class WorkloadSettings:
    """What a command's workload options say: the workload, its targets, how the simulated
    engine schedules, and the Medusa setting."""

    workload: Workload
    targets: Targets
    engine: EngineConfig
    medusa: str

    @property
    def simulated(self) -> bool:
        """Whether the serving simulation is asked for: a rate, a trace or a TTFT/TPOT target."""
        return self.workload.arrivals or self.targets.simulated


def seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def lengths_arg(values, flag: str) -> Lengths:
    """--prompt-len / --response-len: MEAN or MEAN P95."""
    if len(values) > 2:
        raise PerfkitError(f"{flag} takes a mean and optionally a p95, got {len(values)} values")
    return Lengths.of(values[0] if len(values) == 1 else tuple(values), flag)


def medusa(target: Target) -> None:
    add_options(target, MedusaOptions)
