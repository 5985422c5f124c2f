"""The step model's former import path (`from perfmodel.step import StepModel`), kept for
code written against it; the model lives in perfmodel.latency.step."""

from perfmodel.latency.step import StepModel

__all__ = ["StepModel"]
