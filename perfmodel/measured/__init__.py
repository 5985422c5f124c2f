"""Measured evidence: the data contract's rows, the measurements shipped and stored, and the
device view that joins a device's spec with its measurements."""
