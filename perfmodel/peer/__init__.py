"""The project's engine-regime step times beside a peer's: NVIDIA aiconfigurator's static
estimates of the same points, read from the same family of measured tables
(python -m perfmodel.peer_check; docs/peer-check.md)."""
