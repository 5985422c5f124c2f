"""The shared options that say how the performance model prices a step, beyond its flavour
(--step, perfmodel.cli.options), each declared here and nowhere else, composed as
perfmodel.cli.options' are (`pricing_options.tp(p)`):
  --latency, --stack     the latency source, and whose GPU measurements it predicts
  --tp N|auto            the tensor-parallel degree
  --host-dispatch FILE   a measured host's per-op issue costs: the step through host and device queues
  --cuda-graph           the traced step's forward replayed from a CUDA graph
"""

from __future__ import annotations

from pathlib import Path

from perfmodel.cli.options import Target
from perfmodel.cli.parser import TP_HELP, tp_degree
from perfmodel.latency.choice import LATENCY_CHOICES
from perfmodel.latency.gemm_grid import ENGINES, TORCH, VIDUR


def latency(target: Target) -> None:
    target.add_argument(
        "--latency",
        choices=LATENCY_CHOICES,
        default="auto",
        help="latency source: auto (default) = measured where the device was measured (shipped profiles or given "
        "sweeps), calibrated on its measurements for other shapes, borrowed from a measured device of the same "
        "architecture, else the datasheet roofline; or force one",
    )
    # Read with --latency: the command line's parse makes args.latency a LatencyChoice carrying it.
    target.add_argument(
        "--stack",
        metavar="STACK",
        help=f"whose GPU measurements to predict: {', '.join((VIDUR, *ENGINES, TORCH))} (the harness of Vidur's "
        "per-model profiles, an engine's device-wide GEMM grid from aiconfigurator-core, or this project's own GPU "
        "campaign: torch's kernels, as the reference decoder runs them), or a stack-version such as vllm-0.24.0 "
        "(default: the device's per-model profiles where it has them, else its first engine grid in that order; "
        "the reference decoder's traced step: the device's torch stack where it has one); the latency label names it",
    )


def tp(target: Target) -> None:
    target.add_argument("--tp", type=tp_degree, default=1, metavar="N|auto", help=TP_HELP)


def host_dispatch(target: Target) -> None:
    """--host-dispatch: the host's per-op issue costs (python -m profilers.host_dispatch)."""
    target.add_argument(
        "--host-dispatch",
        type=Path,
        metavar="FILE",
        help="a python -m profilers.host_dispatch JSON of this GPU host: price each step as host and device queues "
        "(perfmodel.latency.pipeline) instead of scaling its kernels by the plain step's in-step factor",
    )


def cuda_graph(target: Target) -> None:
    """How the traced step launches its kernels: one by one (eager) or replayed from a CUDA graph."""
    target.add_argument(
        "--cuda-graph",
        action="store_true",
        help="price the traced step's forward pass replayed from a CUDA graph, as vLLM, SGLang and TensorRT-LLM run "
        "decoding: each of its kernels costs the spec's graph_node_us instead of an eager kernel_launch_us (the "
        "candidates, verification and KV update stay eager; perfmodel.latency.traced); a GPU only",
    )
