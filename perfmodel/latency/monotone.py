"""Measured times made non-decreasing in their sizes, and the speed-of-light floor under them.

A measured grid of kernel times (a GEMM's over m, n and k; attention's over batch and
context) holds dips: timing noise, and a harness that picked a faster kernel at one size
than at the size below it. A larger problem is never cheaper than a smaller one in an
engine (it could run the smaller one padded), and interpolation between dips gives answers
that fall as the work grows. So a grid is fitted, along each axis in turn, by the
least-squares non-decreasing sequence (isotonic regression: violating neighbours are
averaged, steps kept), then made exactly non-decreasing along every axis by a running
maximum, which keeps what the axes before it made monotone. Where the data already rise,
nothing changes.

No time goes below its speed-of-light floor either: the kernel's bytes at the datasheet
bandwidth, or its FLOPs at the datasheet peak (perfmodel.latency.roofline.speed_of_light).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import isotonic_regression


def non_decreasing(values: np.ndarray, axes=None) -> np.ndarray:
    """`values` (e.g. log times on a grid) made non-decreasing along each of `axes` (all by
    default): isotonic regression along each axis in turn, then a running maximum along each."""
    out = np.array(values, dtype=float)
    axes = range(out.ndim) if axes is None else axes
    for axis in axes:
        moved = np.moveaxis(out, axis, -1)
        flat = moved.reshape(-1, moved.shape[-1])
        fitted = np.stack([isotonic_regression(row).x for row in flat]) if len(flat) else flat
        out = np.moveaxis(fitted.reshape(moved.shape), -1, axis)
    for axis in axes:
        out = np.maximum.accumulate(out, axis=axis)
    return out
