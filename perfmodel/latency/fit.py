"""The one fit of the roofline's three parameters (compute efficiency, memory efficiency,
per-kernel overhead) to measured times: least squares on log(time), so a 5 us kernel and a
5 ms one weigh the same.

Its callers differ only in what they predict (perfmodel.latency.source: single GEMMs;
perfmodel.latency.calibration: whole ops of data-contract rows) and in where the search
starts and how far it may go (`FitBounds`), which each keeps as it was chosen.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams


@dataclass(frozen=True)
class FitBounds:
    """Start and bounds of the search: (compute efficiency, memory efficiency, overhead in us)."""

    start: tuple[float, float, float]
    lower: tuple[float, float, float]
    upper: tuple[float, float, float]


# Measured GEMMs of a real device: efficiencies near the public figures, overheads of a few us.
GEMM_BOUNDS = FitBounds((0.7, 0.8, 5.0), (0.02, 0.02, 0.0), (1.0, 1.0, 100.0))
# Any measured rows, whatever their device: a wide search from the middle.
ROWS_BOUNDS = FitBounds((0.5, 0.5, 5.0), (1e-3, 1e-3, 0.0), (1.0, 1.0, 1e4))


def fit_roofline_params(
    predict: Callable[[RooflineParams], np.ndarray], log_measured: np.ndarray, bounds: FitBounds, label: str
) -> RooflineParams:
    """The parameters whose `predict(params)` (seconds, one per measurement) best match
    `log_measured` (the log of the measured seconds) in the least-squares sense."""
    # scipy.optimize takes a third of a second to import; only a fit needs it.
    from scipy.optimize import least_squares

    def residuals(x):
        return np.log(predict(RooflineParams(x[0], x[1], x[2] * 1e-6))) - log_measured

    fit = least_squares(residuals, x0=list(bounds.start), bounds=(list(bounds.lower), list(bounds.upper)))
    return RooflineParams(fit.x[0], fit.x[1], fit.x[2] * 1e-6, label=label)


def fit_key(*parts) -> str:
    """A digest of everything a fit depends on: arrays by their bytes, anything else by repr."""
    digest = hashlib.sha256()
    for part in parts:
        data = np.ascontiguousarray(part).tobytes() if isinstance(part, np.ndarray) else repr(part).encode()
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def remembered_fit(key: str, fit: Callable[[], RooflineParams], folder: Path) -> RooflineParams:
    """`fit()`, or its result from an earlier process with the same inputs (`key`, from
    fit_key). The fit is a third of a command's start-up (importing scipy.optimize and
    solving), and the shipped profiles it runs on do not change between runs. JSON keeps a
    float's every bit, so a remembered fit predicts exactly what a fresh one does; an
    unreadable or unwritable file only costs the fit again."""
    path = Path(folder) / f"{key}.json"
    try:
        return RooflineParams(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, PerfkitError):
        pass
    params = fit()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            json.dump(asdict(params), out)
        os.replace(temporary, path)
    except OSError:
        pass
    return params
