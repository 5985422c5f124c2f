"""A serving engine's measurement folder (profilers.engine writes it; the serving check reads
it): what each file holds, and reading them back.

    meta.json     the engine (name, version, arguments), the machine, the model, the workload
    steps.csv     step costs measured through the engine (profilers.engine.steps), in two passes,
                  before the load runs and after: pass, kind (prefill, mixed or decode), batch,
                  tokens (the prompt), context (mean tokens in the KV cache), step_s, iqr_s, samples
    requests.csv  one row per request of every load run (rate, repeat): arrival_s, sent_s,
                  first_token_s, finish_s, prompt, output, received, ttft_s, tpot_s, e2e_s,
                  itl_mean_s, itl_max_s, complete, error
    runs.csv      one row per load run: rate, repeat, requests, failed, wall_s, preemptions,
                  tokens_s (steady-state output tokens per second), client_lag_max_s (the
                  latest the client sent a request after its arrival), iteration_tokens (JSON: the
                  engine's iterations by tokens scheduled, [bucket's upper bound, iterations])
    server.log    the engine's own log of the measurement
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.hardware.cpu_identity import this_cpu_key
from perfmodel.measured.store import MEASUREMENTS_DIR

ENGINE_FOLDER = "engine-vllm"
ENGINES = ("vllm",)
STEP_COLUMNS = ("pass", "kind", "batch", "tokens", "context", "step_s", "iqr_s", "samples")
REQUEST_COLUMNS = (
    "request",
    "arrival_s",
    "sent_s",
    "first_token_s",
    "finish_s",
    "prompt",
    "output",
    "received",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "itl_mean_s",
    "itl_max_s",
    "complete",
    "error",
    "rate",
    "repeat",
)
RUN_COLUMNS = (
    "rate",
    "repeat",
    "requests",
    "failed",
    "wall_s",
    "preemptions",
    "tokens_s",
    "client_lag_max_s",
    "iteration_tokens",
)


@dataclass(frozen=True)
class EngineMeasurement:
    folder: Path
    meta: dict
    steps: pd.DataFrame
    requests: pd.DataFrame
    runs: pd.DataFrame


def read_columns(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise PerfkitError(f"{path} is missing: measure it with python -m profilers.engine measure")
    frame = pd.read_csv(path)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise PerfkitError(f"{path}: missing column(s) {', '.join(missing)}")
    return frame


def read_engine_measurement(folder: Path) -> EngineMeasurement:
    folder = Path(folder)
    if not folder.is_dir():
        raise PerfkitError(f"no engine measurement folder {folder}; shipped ones: {', '.join(shipped()) or 'none'}")
    meta = read_json(folder / "meta.json", "engine measurement metadata")
    return EngineMeasurement(
        folder,
        meta,
        read_columns(folder / "steps.csv", STEP_COLUMNS),
        read_columns(folder / "requests.csv", REQUEST_COLUMNS),
        read_columns(folder / "runs.csv", RUN_COLUMNS),
    )


def default_engine_folder() -> Path:
    """The shipped measurement of this machine's CPU (by its measurement key), else the first
    shipped one."""
    folders = shipped()
    if not folders:
        raise PerfkitError(f"no engine measurement is shipped under {MEASUREMENTS_DIR}")
    here = [f for f in folders if f.startswith(this_cpu_key() + "/")]
    return MEASUREMENTS_DIR / (here or folders)[0]


def shipped() -> list[str]:
    """Shipped measurement folders, relative to profilers/measurements."""
    return sorted(
        str(p.parent.relative_to(MEASUREMENTS_DIR)) for p in MEASUREMENTS_DIR.glob(f"*/{ENGINE_FOLDER}/*/meta.json")
    )
