"""A serving engine's measurement folder (profilers.engine writes it; the serving check reads
it): what each file holds, and reading them back.

    meta.json     the engine (name, version, arguments), the machine, the model, the workload
    steps.csv     step costs measured through the engine (profilers.engine.steps), in two passes,
                  before the load runs and after: pass, kind (prefill, mixed or decode), batch,
                  tokens (the prompt), context (mean tokens in the KV cache), step_s, iqr_s, samples,
                  and at decoding points drafts and accepted (a speculating engine's, /metrics)
    requests.csv  one row per request of every load run (rate, repeat): arrival_s, sent_s,
                  first_token_s, finish_s, prompt, output, received, ttft_s, tpot_s, e2e_s,
                  itl_mean_s, itl_max_s, complete, error
    runs.csv      one row per load run: rate, repeat, requests, failed, wall_s, preemptions,
                  tokens_s (steady-state output tokens per second), client_lag_max_s (the
                  latest the client sent a request after its arrival), iteration_tokens (JSON: the
                  engine's iterations by tokens scheduled, [bucket's upper bound, iterations])
    speculation.csv  where the engine speculated: per load run its drafts, draft tokens and
                  the tokens accepted at each draft position (JSON list), from /metrics
    decoder-speculation.csv  where the engine drafted with the model's Medusa heads: per load
                  run's prompts (repeat), the project's decoder drafting as the engine does (a
                  chain of each head's top-1, greedy) on the same prompts: drafts, draft tokens
                  and the tokens accepted at each draft position (profilers.engine acceptance)
    server.log    the engine's own log of the measurement
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perfmodel.base.engine_speculation import EngineSpeculation
from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.base.paths import TOOLKIT_ROOT
from perfmodel.hardware.cpu_identity import this_cpu_key
from perfmodel.measured.store import MEASUREMENTS_DIR

ENGINE_FOLDER = "engine-vllm"
ENGINES = ("vllm",)
SPECULATION_COLUMNS = ("rate", "repeat", "drafts", "draft_tokens", "accepted_per_position")
DECODER_SPECULATION_FILE = "decoder-speculation.csv"
DECODER_SPECULATION_COLUMNS = ("repeat", "drafts", "draft_tokens", "accepted_per_position")
# the same per request (its index in the run's prompts): where each one's acceptance differs
DECODER_REQUESTS_FILE = "decoder-requests.csv"
DECODER_REQUEST_COLUMNS = ("repeat", "request", "drafts", "accepted_per_position")
STEP_COLUMNS = ("pass", "kind", "batch", "tokens", "context", "step_s", "iqr_s", "samples")
# a decoding point's drafts and accepted tokens (a speculating engine; none in older folders),
# and its median gap between streamed chunks: an iteration (none in older folders)
STEP_SPECULATION_COLUMNS = ("drafts", "accepted", "iteration_s")
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
    speculation: pd.DataFrame | None  # where the engine speculated
    decoder_speculation: pd.DataFrame | None = None  # the project's decoder on the same prompts
    decoder_requests: pd.DataFrame | None = None  # the same per request (none in older folders)

    @property
    def speculating(self) -> EngineSpeculation:
        return EngineSpeculation(self.meta["plan"].get("speculation", EngineSpeculation.OFF))


def read_columns(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    if not path.is_file():
        raise PerfkitError(f"{path} is missing: measure it with python -m profilers.engine measure")
    frame = pd.read_csv(path)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise PerfkitError(f"{path}: missing column(s) {', '.join(missing)}")
    return frame


def engine_folder(text: str | Path) -> Path:
    """The measurement folder `text` names: a path from the working folder, else one inside
    the toolkit (profilers/measurements/... works from anywhere), else a shipped one by its
    path under profilers/measurements or its own name (bundled-seqs8) where one has it."""
    path = Path(text).expanduser()
    for candidate in (path, TOOLKIT_ROOT / path, MEASUREMENTS_DIR / path):
        if candidate.is_dir():
            return candidate
    named = [MEASUREMENTS_DIR / name for name in shipped() if Path(name).name == path.name]
    return named[0] if len(named) == 1 else path


def read_engine_measurement(folder: str | Path) -> EngineMeasurement:
    folder = engine_folder(folder)
    if not folder.is_dir():
        raise PerfkitError(f"no engine measurement folder {folder}; shipped ones: {', '.join(shipped()) or 'none'}")
    meta = read_json(folder / "meta.json", "engine measurement metadata")
    speculated, decoded = folder / "speculation.csv", folder / DECODER_SPECULATION_FILE
    per_request = folder / DECODER_REQUESTS_FILE
    return EngineMeasurement(
        folder,
        meta,
        read_columns(folder / "steps.csv", STEP_COLUMNS).reindex(columns=[*STEP_COLUMNS, *STEP_SPECULATION_COLUMNS]),
        read_columns(folder / "requests.csv", REQUEST_COLUMNS),
        read_columns(folder / "runs.csv", RUN_COLUMNS),
        read_columns(speculated, SPECULATION_COLUMNS) if speculated.exists() else None,
        read_columns(decoded, DECODER_SPECULATION_COLUMNS) if decoded.exists() else None,
        read_columns(per_request, DECODER_REQUEST_COLUMNS) if per_request.exists() else None,
    )


def default_engine_folder() -> Path:
    """The shipped measurement of plain decoding on this machine's CPU (by its measurement
    key), else on any; one with the engine's speculation where none is plain."""
    folders = shipped()
    if not folders:
        raise PerfkitError(f"no engine measurement is shipped under {MEASUREMENTS_DIR}")

    def preference(folder: str) -> tuple[bool, bool, str]:
        plan = read_json(MEASUREMENTS_DIR / folder / "meta.json", "engine measurement metadata")["plan"]
        speculating = EngineSpeculation(plan.get("speculation", EngineSpeculation.OFF)) is not EngineSpeculation.OFF
        return not folder.startswith(this_cpu_key() + "/"), speculating, folder

    return MEASUREMENTS_DIR / min(folders, key=preference)


def shipped() -> list[str]:
    """Shipped measurement folders, relative to profilers/measurements."""
    return sorted(
        str(p.parent.relative_to(MEASUREMENTS_DIR)) for p in MEASUREMENTS_DIR.glob(f"*/{ENGINE_FOLDER}/*/meta.json")
    )
