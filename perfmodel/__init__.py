"""Analytic core: hardware specs, model configs, operator costs, latency prediction and the CLIs
(python -m perfmodel.roofline)."""
