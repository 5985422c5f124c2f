"""Numbers as people read them: rates and sizes in the unit that keeps three significant digits."""

from __future__ import annotations


def flops_text(flops_per_s: float, unit: str = "FLOP/s") -> str:
    """A rate with three significant digits in the unit that keeps them: a CPU's 0.0017
    TFLOP/s reads 1.70 GFLOP/s, not 0.00 TFLOP/s."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.3g} {prefix}{unit}"
    return f"{flops_per_s / 1e3:.3g} k{unit}"


def bytes_text(nbytes: float) -> str:
    """A size with three significant digits in the unit that keeps them (1 GB = 1e9 bytes,
    as device specs give memory): a small model's 4.19 MB, not 0.0 GB."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {prefix}B"
    return f"{nbytes:.3g} B"
