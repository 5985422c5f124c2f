"""How long a step takes: roofline and calibrated operator times, measured GEMM tables, the
latency source that picks among them, the step model and tensor parallelism's all-reduces."""

from perfmodel.latency.roofline import RooflineLatency
from perfmodel.latency.source import latency_source
from perfmodel.latency.step import StepModel

__all__ = ["RooflineLatency", "StepModel", "latency_source"]
