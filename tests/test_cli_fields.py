"""Options declared once as dataclass fields, the parser generated from them (perfmodel.cli.fields)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser
from perfmodel.cli.fields import add_options, option, read_options
from perfmodel.cli.parser import positive_int
from perfmodel.cli.workload_options import WorkloadOptions
from perfmodel.latency.choice import LatencyChoice
from reports.commands.plan import PlanOptions
from reports.commands.plan import build_parser as plan_parser


@dataclass(frozen=True)
class Toy:
    size: int = field(default=4, metadata=option("--size", "how many (default %(default)s)", type=positive_int))
    names: tuple[str, ...] = field(default=("a",), metadata=option("--names", "which", nargs="+"))
    internal: str = "not an option"


def test_a_dataclass_becomes_its_parser_and_comes_back():
    p = Parser(prog="toy")
    add_options(p, Toy)
    assert read_options(Toy, p.parse_args([])) == Toy(4, ("a",))
    assert read_options(Toy, p.parse_args(["--size", "9", "--names", "x", "y"])) == Toy(9, ("x", "y"))
    assert "how many (default 4)" in p.format_help()
    assert "--internal" not in p.format_help()


def test_a_bad_value_is_a_one_line_usage_error(capsys):
    p = Parser(prog="toy")
    add_options(p, Toy)
    with pytest.raises(SystemExit) as exit_:
        p.parse_args(["--size", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "toy: error: argument --size: must be a positive integer, got '0' (see --help)\n"


def workload_settings(args, throughput=None):
    return read_options(WorkloadOptions, args).settings(throughput)


def test_every_workload_field_is_an_option_of_the_plan_command():
    text = plan_parser().format_help()
    for f in fields(WorkloadOptions):
        assert f.metadata["cli"]["flag"] in text, f.name


def test_workload_options_give_one_workload_and_its_targets():
    args = plan_parser().parse_args(
        ["--gpu", "h100", "--prompt-len", "1024", "2048", "--rate", "5", "--tpot-ms", "50", "--latency-ms", "30"]
    )
    settings = workload_settings(args, throughput=1000.0)
    assert (settings.workload.prompt.mean, settings.workload.prompt.p95) == (1024, 2048)
    assert settings.workload.rate == 5 and settings.workload.arrivals and settings.simulated
    assert (settings.targets.tpot_s, settings.targets.latency_s, settings.targets.tokens_s) == (0.05, 0.03, 1000.0)
    unloaded = workload_settings(plan_parser().parse_args(["--gpu", "h100"]))
    assert not unloaded.simulated and unloaded.workload.step_context == 512 + 128


def test_a_target_without_a_load_is_refused_in_one_line():
    args = plan_parser().parse_args(["--gpu", "h100", "--ttft-ms", "200"])
    with pytest.raises(PerfkitError, match="need a load to hold at: give --rate, --trace or --throughput"):
        workload_settings(args)


def test_a_command_is_its_options_dataclass():
    """python -m perfmodel.plan reads one PlanOptions: shared options, the workload's group and
    its own, each declared once."""
    args = plan_parser().parse_args(["--gpu", "h100", "a100", "--tp", "auto", "--rate", "5", "--batch", "1", "8"])
    options = read_options(PlanOptions, args)
    assert options.gpu == ["h100", "a100"] and options.tp is None and options.batch == (1, 8)
    assert options.workload == WorkloadOptions(rate=5.0)
    assert options.latency == LatencyChoice()  # --latency and --stack, one choice: auto, the default stack
    assert (options.model, options.step, options.reserve, options.json) == ("llama-7b", "full", 0.1, False)
