"""`medusa-perfkit COMMAND ...`: every `python -m` command of the toolkit under one name.

The commands live in layers above this one (profilers, decoder, reports), so they are
named here by module path and run with runpy, exactly as `python -m` runs them: nothing
is imported until a command is asked for, and `medusa-perfkit --help` imports none.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import runpy
import sys
from typing import NoReturn

from perfmodel.cli.parser import Parser, run

# name -> (module run as __main__, its one-line summary). tests/test_cli_options.py checks
# that this lists exactly the modules with a `__main__` block.
COMMANDS: dict[str, tuple[str, str]] = {
    "campaign": ("profilers.campaign", "measure a lent GPU (or this CPU) for the toolkit in one resumable run"),
    "roofline": ("perfmodel.roofline", "the paper's Appendix G rooflines for a device and models"),
    "speedup": ("perfmodel.speedup", "Medusa speedup and the best tree size per device (the paper's simulations)"),
    "plan": ("perfmodel.plan", "capacity planning: what fits, which tree at each batch, how fast"),
    "schedule": ("perfmodel.schedule", "the tree or off per batch and context band, for vLLM, SGLang and TensorRT-LLM"),
    "validate": ("perfmodel.validate", "predict the Medusa (or EAGLE) speedup, then run the decoder and compare"),
    "closed-loop-results": ("profilers.closed_loop.results", "closed-loop runs as a results page's Markdown tables"),
    "twin-results": ("profilers.closed_loop.twin_results", "the twin closed loop's runs as Markdown tables"),
    "regimes": ("profilers.closed_loop.regimes", "each launch regime's error: twin runs priced by the model alone"),
    "node-classes": (
        "profilers.closed_loop.node_classes",
        "the graph step's kernel classes priced as CUDA-graph nodes, beside a GPU profile",
    ),
    "latency-check": ("perfmodel.latency_check", "how well the calibrated latency predicts unseen shapes"),
    "transfer-check": ("perfmodel.transfer_check", "how well GEMM latency transfers to unmeasured devices"),
    "trace": ("decoder.trace", "the kernels of one decoding step, traced on the meta device"),
    "attention-check": ("perfmodel.attention_check", "how well measured attention predicts unmeasured head shapes"),
    "published-check": (
        "perfmodel.published_check",
        "published GPU measurements of speculative decoding beside the predictions",
    ),
    "peer-check": (
        "perfmodel.peer_check",
        "engine-regime TPOT and TTFT beside NVIDIA aiconfigurator's",
    ),
    "engine-kernels": ("profilers.engine_kernels", "time on a GPU the LM head and fused norm the engine steps derive"),
    "host-dispatch": ("profilers.host_dispatch", "time what the host spends issuing one tiny op, per kernel kind"),
    "ngram-lookup": (
        "profilers.ngram_lookup",
        "time n-gram (prompt-lookup) drafting's lookup on this host, per sequence per step",
    ),
    "step-bench": ("profilers.step_bench", "kernels and Python time per decoding step, eager against static, by batch"),
    "allreduce-compare": ("perfmodel.allreduce_compare", "the ring all-reduce model against measured tables"),
    "allreduce": ("profilers.allreduce", "time all-reduce over processes (gloo on CPU, NCCL on GPUs) for tp plans"),
    "sweep": ("profilers.sweep", "time every operator of a decoding step over a grid"),
    "engine": ("profilers.engine", "a real serving engine (vLLM's CPU build): set up, measure, check the simulation"),
    "import": ("profilers.imports", "import public measured GPU operator profiles (Vidur)"),
    "measure": ("decoder.measure", "real acceptance rates of Medusa heads, and real speedups"),
    "generate": ("decoder.generate", "try the model, streaming text as it is accepted"),
    "ablation": ("decoder.ablation", "the Medusa paper's Fig. 4 on a real model and this machine"),
    "train": ("decoder.train", "reproduce the bundled model, its tokenizer and its Medusa heads"),
    "checkpoint": ("decoder.checkpoint", "check a checkpoint folder's weights and config"),
    "reports": ("reports", "HTML performance reports: build (one device) or compare (several)"),
    "readme-samples": ("reports.readme_samples", "regenerate (or --check) the sample outputs of the README and docs/"),
    "golden": ("reports.golden", "every documented command's output and files, byte for byte against another commit"),
    "startup-benchmark": ("reports.startup_benchmark", "time the roofline command and a report build, as run"),
    "search-benchmark": ("perfmodel.search_benchmark", "time the README's serving search beside the import floor"),
}

# The commands whose code runs the decoder, the profilers or the reports: their code is on
# the floor above the analytic core (reports.commands), and perfmodel's module of the
# command's name only runs it, by name (run_command_code), so the core imports nothing above
# it. perfmodel.plan is also the planner function, so that module is never imported.
COMMAND_CODE = {
    "perfmodel.plan": "reports.commands.plan",
    "perfmodel.roofline": "reports.commands.roofline",
    "perfmodel.speedup": "reports.commands.speedup",
    "perfmodel.validate": "reports.commands.validate",
    "perfmodel.search_benchmark": "reports.commands.search_benchmark",
    "perfmodel.published_check": "reports.commands.published_check",
}


def command_code(module: str) -> str:
    """The module holding a command's main and build_parser (`module` itself, mostly)."""
    return COMMAND_CODE.get(module, module)


def run_command_code(module: str) -> NoReturn:
    """`python -m module` for a command whose code is elsewhere (COMMAND_CODE): its main, run
    as perfmodel.cli.run runs every command; the process then ends without a last garbage
    collection, which would scan every object the run made (pandas, matplotlib) for a fifth of
    a second to free memory the exit frees anyway."""
    status = run(importlib.import_module(COMMAND_CODE[module]).main)
    gc.freeze()
    sys.exit(status)


def build_parser() -> Parser:
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items())
    p = Parser(
        prog="medusa-perfkit",
        usage="medusa-perfkit [-h] COMMAND [ARGS ...]",
        description="Performance modelling and profiling of LLM decoding with Medusa heads. Each command is also "
        "`python -m MODULE`; `medusa-perfkit COMMAND --help` shows its options.",
        epilog=f"commands:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "command", choices=tuple(COMMANDS), metavar="COMMAND", help="one of the commands below; ARGS are its own"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv[:1])  # --help, or a one-line error for an unknown command
    module = COMMANDS[args.command][0]
    sys.argv = [f"medusa-perfkit {args.command}", *argv[1:]]
    # The command's own `sys.exit(run(main))` ends the process with its status.
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0
