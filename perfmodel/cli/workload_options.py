"""The options of a workload, declared once: what a deployment serves and must meet (lengths,
a request rate or trace, latency targets), the Medusa setting and how the engine schedules,
and the settings a command reads back from them (WorkloadSettings).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.cli.parser import positive_int, positive_number
from perfmodel.planning.lengths import DEFAULT_PROMPT_LEN, DEFAULT_RESPONSE_LEN, Lengths
from perfmodel.planning.medusa_setting import MEDUSA_MODES
from perfmodel.serving.simulator import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_SEQS, PREFILL_MODES, EngineConfig
from perfmodel.serving.workload import PERCENTILES, ServingWorkload, Targets

Target = argparse._ActionsContainer  # a parser or a (mutually exclusive) group of one


def workload(target: Target) -> None:
    """What a deployment serves and must meet: lengths, a request rate or trace, latency
    targets, the Medusa setting and how the engine schedules (read back by
    workload_settings)."""
    for flag, default, what in (
        ("--prompt-len", DEFAULT_PROMPT_LEN, "prompt"),
        ("--response-len", DEFAULT_RESPONSE_LEN, "response"),
    ):
        target.add_argument(
            flag,
            nargs="+",
            type=positive_number,
            default=[default],
            metavar="TOKENS",
            help=f"{what} tokens: MEAN [P95] (default {default}; the KV cache is sized for the p95)",
        )
    target.add_argument(
        "--latency-ms", type=positive_number, metavar="MS", help="per-token latency target per user, in ms (unloaded)"
    )
    target.add_argument(
        "--rate",
        type=positive_number,
        metavar="REQ_S",
        help="requests per second to serve: runs the serving simulation",
    )
    target.add_argument(
        "--trace",
        type=Path,
        metavar="CSV",
        help="a request trace (arrival_s, prompt_tokens, output_tokens per row) to simulate instead of Poisson "
        "arrivals; --rate rescales its arrivals",
    )
    target.add_argument("--ttft-ms", type=positive_number, metavar="MS", help="time-to-first-token target, in ms")
    target.add_argument("--tpot-ms", type=positive_number, metavar="MS", help="time-per-output-token target, in ms")
    target.add_argument(
        "--percentile",
        type=int,
        choices=PERCENTILES,
        default=90,
        help="the percentile of requests the TTFT and TPOT targets hold for (default %(default)s)",
    )
    medusa(target)
    target.add_argument(
        "--prefill",
        choices=PREFILL_MODES,
        default="separate",
        help="how the simulated engine prefills: separate iterations (vLLM v0, TGI) or chunked into decoding "
        "iterations up to --chunk-tokens (vLLM v1, SGLang) (default %(default)s)",
    )
    target.add_argument(
        "--chunk-tokens",
        type=positive_int,
        default=DEFAULT_CHUNK_TOKENS,
        metavar="TOKENS",
        help="tokens per iteration with --prefill chunked, the step's own tokens included (default %(default)s)",
    )
    target.add_argument(
        "--max-seqs",
        type=positive_int,
        default=DEFAULT_MAX_SEQS,
        metavar="N",
        help="the simulated engine's cap on running sequences, as vLLM's max_num_seqs (default %(default)s; the KV "
        "cache may hold fewer)",
    )


@dataclass(frozen=True)
class WorkloadSettings:
    """What workload() declared, read back: the lengths and per-token target of a capacity
    plan, and, where a rate, trace or TTFT/TPOT target is given, the serving simulation's
    workload, targets and engine (serving None otherwise)."""

    prompt: object
    response: object
    latency_target_s: float | None
    medusa: str
    serving: tuple[ServingWorkload, Targets, EngineConfig] | None


def lengths_arg(values: list[float], flag: str):
    """--prompt-len / --response-len: MEAN or MEAN P95."""
    if len(values) > 2:
        raise PerfkitError(f"{flag} takes a mean and optionally a p95, got {len(values)} values")
    return Lengths.of(values[0] if len(values) == 1 else tuple(values), flag)


def workload_settings(args, throughput: float | None = None) -> WorkloadSettings:
    prompt = lengths_arg(args.prompt_len, "--prompt-len")
    response = lengths_arg(args.response_len, "--response-len")
    latency = None if args.latency_ms is None else args.latency_ms / 1e3
    serving = None
    if args.rate is not None or args.trace is not None or args.ttft_ms is not None or args.tpot_ms is not None:
        if args.rate is None and args.trace is None and throughput is None:
            raise PerfkitError("--ttft-ms and --tpot-ms need a load to hold at: give --rate, --trace or --throughput")
        serving = (
            ServingWorkload(args.rate, prompt, response, args.trace),
            Targets(
                None if args.ttft_ms is None else args.ttft_ms / 1e3,
                None if args.tpot_ms is None else args.tpot_ms / 1e3,
                args.percentile,
                throughput,
            ),
            EngineConfig(args.prefill, args.chunk_tokens, args.max_seqs),
        )
    return WorkloadSettings(prompt, response, latency, args.medusa, serving)


def medusa(target: Target) -> None:
    target.add_argument(
        "--medusa",
        choices=tuple(MEDUSA_MODES),
        default="auto",
        help="; ".join(f"{name} = {meaning}" for name, meaning in MEDUSA_MODES.items()) + " (default auto)",
    )
