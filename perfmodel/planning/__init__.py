"""Answers from the model: the paper's speedup simulations, the best tree, memory fit and the
capacity plan."""

from perfmodel.planning.capacity import plan
from perfmodel.planning.result import PlanResult

__all__ = ["PlanResult", "plan"]
