"""The serving search's answer as data: each configuration's capacity and latencies
(ServingOption), every configuration searched and the one to deploy (ServingAnswer), and
their table and JSON (perfmodel.serving.capacity.serve searches; perfmodel.serving.summary
says it in words)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from perfmodel.planning.schedule_format import SpeculationSchedule
from perfmodel.planning.workload import Targets
from perfmodel.serving.simulator import EngineConfig

NAN = float("nan")  # a latency or rate a configuration that serves nothing has not


@dataclass(frozen=True)
class ServingOption:
    """One configuration's answer. Rates are requests/s, tokens/s are output tokens; latencies
    in seconds at `load_rate` per replica (the target rate's share of the replicas needed,
    else the highest rate meeting the targets)."""

    device: str
    name: str
    tp: int
    dtype: str
    medusa: str
    fits: bool
    meets_targets: bool
    max_rate: float = 0.0  # the highest request rate one replica serves within the targets
    max_tokens_s: float = 0.0  # output tokens/s of one replica at max_rate
    replicas: int | None = None  # for the target rate (or tokens/s target)
    devices: int | None = None  # replicas x tp
    load_rate: float = NAN
    ttft_p50_s: float = NAN
    ttft_p90_s: float = NAN
    ttft_p99_s: float = NAN
    tpot_p50_s: float = NAN
    tpot_p90_s: float = NAN
    tpot_p99_s: float = NAN
    tokens_s: float = NAN  # output tokens/s of one replica at load_rate
    mean_batch: float = NAN
    tree_share: float = NAN  # share of decoding steps that ran a tree
    unloaded_ttft_s: float = NAN
    unloaded_tpot_s: float = NAN
    kv_capacity_tokens: int = 0
    max_seqs: int = 0
    latency: str = ""
    experts: str = ""  # an MoE model's split over tp (tp, ep; perfmodel.models.moe); '' for a dense one
    note: str = ""
    schedule: SpeculationSchedule | None = field(default=None, repr=False, compare=False)

    def record(self) -> dict:
        """The option as plain data (the schedule as its bands)."""
        data = {k: v for k, v in asdict(self).items() if k != "schedule"}
        data["schedule"] = None if self.schedule is None else json.loads(self.schedule.to_json())
        return data


# Who speculates where a serving answer names no other drafter.
SPECULATOR = "Medusa"


@dataclass(frozen=True)
class ServingAnswer:
    """Every configuration searched, and the one to deploy: the fewest devices for the target
    rate (ties: the most tokens/s per device), or the most tokens/s per device without one."""

    model: str
    workload: str
    targets: Targets
    engine: EngineConfig
    acceptance: str
    target_rate: float | None
    options: tuple[ServingOption, ...]
    speculator: str = SPECULATOR  # who speculates in the options' `medusa` setting: the heads, or another drafter

    @property
    def best(self) -> ServingOption | None:
        ok = [o for o in self.options if o.meets_targets]
        if not ok:
            return None
        if self.target_rate is not None or self.targets.tokens_s is not None:
            return min(ok, key=lambda o: (o.devices, -o.max_tokens_s / o.tp))
        return max(ok, key=lambda o: o.max_tokens_s / o.tp)

    def among(self, device: str | None = None, medusa: str | None = None) -> ServingAnswer:
        """The same answer over the options of one device and/or Medusa setting."""
        kept = tuple(o for o in self.options if device in (None, o.device) and medusa in (None, o.medusa))
        return dataclasses.replace(self, options=kept)

    def to_frame(self) -> pd.DataFrame:
        """One row per configuration (its schedule left out: SpeculationSchedule.to_frame)."""
        rows = [{k: v for k, v in o.record().items() if k != "schedule"} for o in self.options]
        return pd.DataFrame(rows)

    def to_json(self) -> str:
        best = self.best
        return json.dumps(
            {
                "model": self.model,
                "workload": self.workload,
                "targets": self.targets.serving(),
                "engine": asdict(self.engine),
                "acceptance": self.acceptance,
                "target_rate": self.target_rate,
                "best": None if best is None else self.options.index(best),
                "options": [clean(o.record()) for o in self.options],
            },
            indent=2,
        )


def clean(value):
    """JSON has no NaN: None instead, recursively."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value
