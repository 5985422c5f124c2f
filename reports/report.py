"""What a report build is asked for (BuildConfig) and what it gathered (Report).

Shared by the orchestration (reports.build), the page's sections (reports.sections) and
its sentences (reports.prose).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.cli.workload_options import WorkloadOptions, WorkloadSettings
from perfmodel.latency.latency_model import LatencyModel
from perfmodel.latency.step import StepFlavor
from perfmodel.latency.tensor_parallel import TensorParallelStep
from perfmodel.measured.device_view import DeviceView
from perfmodel.models.config import ModelConfig
from reports.sources import ReportAcceptance

FLAVORS = (
    StepFlavor.PAPER,
    StepFlavor.FULL,
)  # the step models simulated: the paper's simplified block, the whole model


# How the page names the whole step it recommends from, per flavour.
STEP_PHRASES = {"full": "whole-model step", "traced": "traced step (the reference decoder's kernels)"}


# What a page answers without workload options: their defaults.
DEFAULT_WORKLOAD = WorkloadOptions().settings()


def latency_target_ms(workload: WorkloadSettings) -> float | None:
    latency = workload.targets.latency_s
    return None if latency is None else latency * 1e3


def simulated_flavors(step: str) -> tuple[str, ...]:
    """The step models a page simulates: the paper's block and the whole model, and the
    traced step beside them when the page is priced by it (--step traced)."""
    return FLAVORS if step == StepFlavor.FULL else (*FLAVORS, StepFlavor(step))


@dataclass(frozen=True)
class BuildConfig:
    model: str
    out: Path | None = None  # None: perf-reports/report/<device>-<model>[-<dtype>] (reports.build.default_folder)
    gpu: str | None = None
    spec: Path | None = None
    dtype: str | None = None
    measurements: tuple[Path, ...] = ()
    acceptance: str | None = None  # a decoder.measure record, "paper", or None (the checkpoint's own, else paper)
    validation: tuple[Path, ...] = ()  # perfmodel.validate CSVs (default: the device's shipped ones)
    ablation: tuple[Path, ...] = ()  # decoder.ablation CSVs (default: the shipped ones)
    workload: WorkloadSettings = DEFAULT_WORKLOAD  # lengths, targets, rate or trace, Medusa setting (--prompt-len ...)
    jobs: int | None = None
    latency: str = "auto"  # perfmodel.latency.source choice
    measure: bool = False  # first sweep this machine's device for the model (stored for later runs)
    tp: int | None = 1  # tensor-parallel degree; None: the capacity plan's choice (planning.capacity.serving_plan)
    step: str = "full"  # the whole-step flavour the page is priced by: full or traced (planning.step_models)
    # A drafter's best chain per batch from its measured per-position acceptance (reports.chain_section);
    # medusa: none (the page's own trees are the Medusa heads')
    drafter: str = "medusa"
    position_rates: tuple[float, ...] | None = None
    draft_config: Path | None = None


@dataclass
class Report:
    """What a build gathered, for the page and for the caller (tests, scripts). reports.build
    resolves the device and prices its step once; the sections and sentences only read them."""

    view: DeviceView
    model: ModelConfig
    dtype: str
    acceptance: ReportAcceptance
    latency: LatencyModel  # the step latency source of the shard (perfmodel.latency.source)
    step: TensorParallelStep  # the whole-model step the page is priced at, timed by `latency`
    tp: int = 1  # tensor-parallel degree the page is priced at (the latency is the shard's)
    html: Path | None = None
    figures: list[str] = field(default_factory=list)  # PNG file names, in page order
    facts: list[str] = field(default_factory=list)  # the "at a glance" sentences

    @property
    def flavor(self) -> str:
        """The whole step's flavour (full or traced): the simulations' rows the page recommends from."""
        return self.step.shard.flavor

    @property
    def step_phrase(self) -> str:
        return STEP_PHRASES[self.flavor]
