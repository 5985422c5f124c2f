"""python -m profilers.engine: vLLM's CPU build serving a project checkpoint, measured.

    python -m profilers.engine setup               the engine's own venv (once; 1-4 minutes, 3.5 GB)
    python -m profilers.engine measure [--quick]   step sweep and load runs into a folder
    python -m profilers.engine check [--quick]     measure, then the simulation's prediction beside it
    python -m profilers.engine acceptance --out F  the decoder drafting as the engine did, on its prompts
    python -m profilers.engine serve-config --config FILE   serve with a speculative config (a schedule's export)

The engine runs from its own Python on 127.0.0.1 and is stopped before the command ends;
the project reaches it over HTTP only. perfmodel.measured.engine_runs says what the folder
holds, perfmodel.serving.engine_check how the prediction is made."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfmodel.base.engine_speculation import EngineSpeculation
from perfmodel.base.output_locks import claimed_dir
from perfmodel.cli import Parser, options, positive_int, positive_number, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.measured.engine_runs import ENGINE_FOLDER, engine_folder, read_engine_measurement
from perfmodel.measured.store import user_measurements_dir
from perfmodel.serving.engine_check import measurement_lines
from profilers.device import cpu_info
from profilers.engine.acceptance import write_decoder_speculation
from profilers.engine.install import default_home, engine_python, setup
from profilers.engine.measure import Plan, measure
from profilers.engine.serve_config import serve_config, served_line
from profilers.engine.server import ServerConfig
from profilers.engine.steps import StepSweep

# The test variant: one rate, a short sweep; a minute or two with the server's start.
QUICK_SWEEP = StepSweep(
    batches=(1, 4, 8), prompts=(64, 256), output=24, prefill_lengths=(1, 64, 128), prefill_repeats=2
)


@dataclass(frozen=True)
class SetupOptions:
    home: Path | None = field(
        default=None,
        metadata=option("--home", f"the engine's venv (default {default_home()})", type=Path, metavar="DIR"),
    )


@dataclass(frozen=True)
class MeasureOptions:
    model: str = field(default="bundled", metadata=shared(options.model, needs_weights=True))
    out: Path | None = field(
        default=None,
        metadata=shared(
            options.out,
            default=f"<home>/measurements/<cpu>/{ENGINE_FOLDER}/<model>-seqs<N>",
            what="the measurement folder (a rerun resumes it)",
        ),
    )
    rates: tuple[float, ...] = field(
        default=Plan.rates,
        metadata=option(
            "--rates", "request rates, per second (default 10 20 25 30)", type=positive_number, nargs="+", metavar="R"
        ),
    )
    repeats: int = field(
        default=Plan.repeats, metadata=option("--repeats", "runs per rate (default %(default)s)", type=positive_int)
    )
    requests: int = field(
        default=Plan.requests,
        metadata=option("--requests", "requests per run (default %(default)s)", type=positive_int),
    )
    prompt_len: int = field(
        default=Plan.prompt_len,
        metadata=option("--prompt-len", "prompt tokens per request (default %(default)s)", type=positive_int),
    )
    response_len: int = field(
        default=Plan.response_len,
        metadata=option("--response-len", "output tokens per request (default %(default)s)", type=positive_int),
    )
    max_num_seqs: int = field(
        default=8,
        metadata=option(
            "--max-num-seqs", "the engine's cap on running sequences (default %(default)s)", type=positive_int
        ),
    )
    max_num_batched_tokens: int = field(
        default=ServerConfig.max_num_batched_tokens,
        metadata=option(
            "--max-num-batched-tokens", "the engine's tokens per iteration (default %(default)s)", type=positive_int
        ),
    )
    kv_cache_gib: float = field(
        default=ServerConfig.kv_cache_gib,
        metadata=option("--kv-cache-gib", "the engine's KV cache (default %(default)s)", type=positive_number),
    )
    speculation: EngineSpeculation = field(
        default=EngineSpeculation.OFF,
        metadata=option(
            "--speculation",
            "the engine's own speculative decoding: medusa (the model's heads), eagle (its drafter in vLLM's "
            "layout) or draft (its draft model, vLLM's draft_model), predicted with the decoder's acceptance on the "
            "same prompts, or ngram (measured only) (default %(default)s)",
            choices=[member.value for member in EngineSpeculation],
        ),
    )
    quick: bool = field(
        default=False,
        metadata=option(
            "--quick", "one run at 20/s of 40 requests and a short step sweep (a test)", action="store_true"
        ),
    )
    engine_python: Path | None = field(
        default=None,
        metadata=option("--engine-python", "the engine venv's Python (default: setup's)", type=Path, metavar="PATH"),
    )
    port: int | None = field(
        default=None, metadata=option("--port", "the server's port (default: a free one)", type=positive_int)
    )

    def plan(self) -> Plan:
        server = ServerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            kv_cache_gib=self.kv_cache_gib,
        )
        plan = Plan(
            self.model, server, StepSweep(), self.prompt_len, self.response_len, self.requests, self.rates, self.repeats
        )
        plan = replace(plan, speculation=EngineSpeculation(self.speculation))
        return replace(plan, sweep=QUICK_SWEEP, rates=(20.0,), repeats=1, requests=40) if self.quick else plan

    def folder(self) -> Path:
        if self.out is not None:
            return self.out
        quick = "-quick" if self.quick else ""
        speculation = EngineSpeculation(self.speculation)
        spec = "" if speculation is EngineSpeculation.OFF else f"-{speculation}"
        name = f"{self.model}-seqs{self.max_num_seqs}{spec}{quick}"
        return user_measurements_dir() / cpu_info().key / ENGINE_FOLDER / name


@dataclass(frozen=True)
class AcceptanceOptions:
    out: Path | None = field(
        default=None,
        metadata=shared(
            options.out,
            default=None,
            required=True,
            what="a measurement folder of the engine's Medusa, EAGLE or draft-model speculation (a shipped one by its "
            "name)",
        ),
    )


@dataclass(frozen=True)
class ServeConfigOptions:
    config: Path = field(
        default=None,
        metadata=option(
            "--config",
            "a --speculative-config JSON file (perfmodel.schedule --engine vllm writes them); its model is replaced by "
            "the checkpoint's drafter (required)",
            type=Path,
            metavar="FILE",
            required=True,
        ),
    )
    model: str = field(default="bundled", metadata=shared(options.model, needs_weights=True))
    requests: int = field(
        default=40, metadata=option("--requests", "requests of the load (default %(default)s)", type=positive_int)
    )
    rate: float = field(
        default=10.0, metadata=option("--rate", "requests per second (default %(default)s)", type=positive_number)
    )
    engine_python: Path | None = field(
        default=None,
        metadata=option("--engine-python", "the engine venv's Python (default: setup's)", type=Path, metavar="PATH"),
    )


COMMANDS = {
    "setup": (SetupOptions, "create the engine's venv and install the pinned engine"),
    "measure": (MeasureOptions, "measure the engine: its step sweep, then load runs over rates"),
    "check": (MeasureOptions, "measure, then print the simulation's prediction beside the measurement"),
    "acceptance": (AcceptanceOptions, "the project's decoder drafting as the engine did, on its prompts"),
    "serve-config": (ServeConfigOptions, "serve with a --speculative-config file (a schedule's vLLM export)"),
}


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.engine", description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (declared, said) in COMMANDS.items():
        add_options(commands.add_parser(name, help=said, description=said), declared)
    return p


def main(argv: list[str] | None = None) -> int:
    parsed = build_parser().parse_args(argv)
    args = read_options(COMMANDS[parsed.command][0], parsed)
    if parsed.command == "setup":
        setup(args.home)
        return 0
    if parsed.command == "acceptance":
        # a folder that holds no measurement is one line, and none is made; one that does is
        # held as measure holds it (perfmodel.base.output_locks.claimed_dir): one writer at a time
        folder = read_engine_measurement(engine_folder(args.out)).folder
        with claimed_dir(folder, "measurement folder"):
            print(f"{write_decoder_speculation(folder)}: written")
        print("\n".join(measurement_lines(read_engine_measurement(folder))))
        return 0
    python = engine_python(args.engine_python)
    if parsed.command == "serve-config":
        plan = Plan(args.model, requests=args.requests)
        server_log = args.config.with_name(args.config.stem + ".server.log")
        print(served_line(args.config, serve_config(args.config, plan, python, args.rate, server_log), args.rate))
        return 0
    folder = measure(args.plan(), args.folder(), python, port=args.port)
    print(f"{folder}: measured")
    if parsed.command == "check":
        print("\n".join(measurement_lines(read_engine_measurement(folder))))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
