"""Measurement on real hardware: timers, device metadata, empirical ceilings and operator sweeps.

Built on perfmodel.models.operators, so benchmarks run exactly the shapes the cost model counts."""
