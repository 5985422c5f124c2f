"""A capacity plan: its tables (PlanResult) and the plan in words: per device, its memory
fit, the best tree per batch band and the recommendation; then the answer over all
devices (fewest devices for the throughput target, or the most tokens/s per replica)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.units import bytes_text
from perfmodel.models.config import ModelConfig
from perfmodel.planning.memory import GB
from perfmodel.planning.workload import Targets, Workload

# The columns of the plan's tables: devices, bands (and what a reader is shown of them).
DEVICE_COLUMNS = [
    "device",
    "name",
    "tensor_parallel",
    "memory_gb",
    "usable_gb",
    "weights_gb",
    "heads_gb",
    "kv_mb_per_token",
    "kv_mb_per_seq",
    "max_batch",
    "fits",
    "batch",
    "tree",
    "tree_size",
    "speculate",
    "speedup",
    "per_token_ms",
    "user_tokens_s",
    "total_tokens_s",
    "meets_latency",
    "devices_needed",
    "best_ms",
    "latency_model",
    "note",
]
BAND_COLUMNS = [
    "device",
    "batch",
    "tree",
    "tree_size",
    "speculate",
    "speedup",
    "acceptance",
    "medusa_step_s",
    "per_token_ms",
    "user_tokens_s",
    "total_tokens_s",
    "memory_gb",
    "meets_latency",
]
# The bands' columns a reader wants, in the CLI and the report.
BAND_SHOWN = [
    "batch",
    "tree",
    "speedup",
    "acceptance",
    "per_token_ms",
    "user_tokens_s",
    "total_tokens_s",
    "memory_gb",
    "meets_latency",
]


@dataclass(frozen=True)
class PlanResult:
    """The plan's tables and the inputs they answer.

    devices: one row per device: memory, max batch, the recommended batch and tree, speeds
             and devices needed (fits False with a `note` where the model does not fit).
    bands:   one row per device x batch that fits: the best tree ("none" where plain
             decoding wins), speedup, per-token latency, per-user and aggregate tokens/s.
    configs: every (device, batch, tree size) configuration evaluated.
    Memory and tokens/s are per replica: all `tensor_parallel` devices of it together.
    """

    model: ModelConfig
    dtype: str
    workload: Workload
    targets: Targets
    acceptance: str
    devices: pd.DataFrame = field(repr=False)
    bands: pd.DataFrame = field(repr=False)
    configs: pd.DataFrame = field(repr=False)
    drafter: str = "medusa"  # who drafts: the Medusa heads, or a drafter's measured chains (heads_gb: its weights)

    @property
    def feasible(self) -> bool:
        """True where some device fits and meets the latency target."""
        return bool(self.devices["meets_latency"].any())

    @property
    def recommendations(self) -> tuple[Recommendation, ...]:
        """The devices table as typed records, one per device."""
        return tuple(Recommendation.of(row) for row in self.devices.to_dict("records"))

    def to_frame(self) -> pd.DataFrame:
        """The devices table: one row per device (bands and configs: the fields of the same names)."""
        return self.devices.copy()

    def to_json(self) -> str:
        """The inputs, one record per device and the bands, as JSON (NaN and NA as null)."""
        w, t = self.workload, self.targets
        return json.dumps(
            {
                "model": self.model.name,
                "dtype": self.dtype,
                "prompt_tokens": {"mean": w.prompt.mean, "p95": w.prompt.p95},
                "response_tokens": {"mean": w.response.mean, "p95": w.response.p95},
                "latency_target_s": t.latency_s,
                "throughput_target": t.tokens_s,
                "acceptance": self.acceptance,
                "source": "predicted",
                "devices": [json_ready(dataclasses.asdict(r)) for r in self.recommendations],
                "bands": [json_ready(r) for r in self.bands.to_dict("records")],
            },
            indent=2,
        )

    def summary(self) -> str:
        """The plan in words."""
        return plan_summary(self)


@dataclass(frozen=True)
class Recommendation:
    """One device's answer: what fits, and the batch and tree to run (None where nothing
    meets the latency target or the model does not fit; `note` says why)."""

    device: str
    name: str
    tensor_parallel: int
    fits: bool
    max_batch: int
    batch: int | None
    tree_size: int | None  # 1: plain decoding
    speedup: float | None
    per_token_ms: float | None
    user_tokens_s: float | None
    total_tokens_s: float | None
    devices_needed: int | None
    latency_model: str
    note: str

    @classmethod
    def of(cls, row: dict) -> Recommendation:
        values = json_ready({f.name: row.get(f.name) for f in dataclasses.fields(cls)})
        return cls(**values)


def json_ready(record: dict) -> dict:
    """Plain Python values: numpy scalars unwrapped, NaN and NA as None."""
    out = {}
    for key, value in record.items():
        if value is pd.NA or (isinstance(value, float | np.floating) and not math.isfinite(value)):
            value = None
        elif isinstance(value, np.integer):
            value = int(value)
        elif isinstance(value, np.floating):
            value = float(value)
        elif isinstance(value, np.bool_):
            value = bool(value)
        out[key] = value
    return out


def plan_summary(result: PlanResult) -> str:
    """The inputs in a sentence, the acceptance, the targets, a paragraph per device and the
    overall answer."""
    w, t = result.workload, result.targets
    lines = [
        f"{result.model.title} ({result.dtype}): prompts {w.prompt} tokens, responses {w.response}; KV cache sized "
        f"for {w.kv_tokens:,} tokens "
        f"per sequence, step latency at a {w.step_context:,}-token context.",
        f"Acceptance: {result.acceptance}.",
    ]
    targets = []
    if t.latency_s is not None:
        targets.append(f"<= {t.latency_s * 1e3:g} ms per token per user")
    if t.tokens_s is not None:
        targets.append(f"{t.tokens_s:,.0f} tokens/s in all")
    if targets:
        lines.append("Target: " + " and ".join(targets) + ".")
    paragraphs = [
        device_paragraph(
            row, result.bands[result.bands["device"] == row.device], t, why_no_tree(result), HELD[result.drafter]
        )
        for row in result.devices.itertuples()
    ]
    return "\n".join(lines) + "\n\n" + "\n\n".join([*paragraphs, overall(result.devices, t)])


def why_no_tree(result: PlanResult) -> str:
    """Why a band runs no tree: a model without heads has no tree to weigh, not one slower
    than plain decoding (another drafter's chains are weighed whatever the heads)."""
    if result.drafter == DrafterKind.MEDUSA and not result.model.medusa_heads:
        return "the model has no Medusa heads"
    return "plain decoding is faster"


# What a plan's heads_gb holds, per drafter, in words.
HELD = {
    "medusa": "Medusa heads",
    "eagle": "the EAGLE head",
    "eagle3": "the EAGLE-3 head",
    "mtp": "the MTP module(s)",
    "draft": "the draft model",
    "ngram": "drafter (n-gram lookup holds none)",
}


def tree_bands(bands: pd.DataFrame, why_none: str = "plain decoding is faster") -> str:
    """'batch 1: tree 160 (2.01x), 2: 80 (1.74x); batch 16-256: none (why_none)' for one device."""
    parts, run_start, prev = [], None, None
    for row in bands.itertuples():
        if row.speculate:
            if run_start is not None:
                parts.append(none_run(run_start, prev, why_none))
                run_start = None
            parts.append(f"batch {row.batch:,}: tree {row.tree_size} ({row.speedup:.2f}x)")
        elif run_start is None:
            run_start = row.batch
        prev = row.batch
    if run_start is not None:
        parts.append(none_run(run_start, prev, why_none))
    return "; ".join(parts)


def none_run(first: int, last: int, why: str) -> str:
    batches = f"batch {first:,}" if first == last else f"batch {first:,}-{last:,}"
    return f"{batches}: none ({why})"


def device_paragraph(
    row, bands: pd.DataFrame, t: Targets, why_none: str = "plain decoding is faster", held: str = HELD["medusa"]
) -> str:
    tp = f" x{row.tensor_parallel} (tensor parallel)" if row.tensor_parallel > 1 else ""
    head = f"{row.name} ({row.device}){tp}: "
    if not row.fits:
        return head + row.note
    text = head + (
        f"{bytes_text(row.weights_gb * GB)} of weights + {bytes_text(row.heads_gb * GB)} of {held}; "
        f"{bytes_text(row.kv_mb_per_seq * 1e6)} of KV cache per sequence -> max batch {row.max_batch:,}. "
        f"Trees: {tree_bands(bands, why_none)}. "
    )
    if not row.meets_latency:
        return text + row.note[0].upper() + row.note[1:]
    tree = f"tree of {row.tree_size}" if row.speculate else "no tree"
    text += (
        f"Recommended: batch {row.batch:,}, {tree}: {row.per_token_ms:.1f} ms/token, "
        f"{row.user_tokens_s:,.0f} tokens/s per user, {row.total_tokens_s:,.0f} tokens/s in all"
    )
    if t.tokens_s is not None:
        text += f"; {row.devices_needed:,} device(s) for {t.tokens_s:,.0f} tokens/s"
    return text + "."


def overall(devices: pd.DataFrame, t: Targets) -> str:
    fits = devices[devices["fits"]]
    ok = fits[fits["meets_latency"]]
    if ok.empty:
        fastest = fits.loc[fits["best_ms"].idxmin()]
        return (
            f"No device meets {t.latency_s * 1e3:g} ms per token: the fastest is {fastest['device']} at "
            f"{fastest['best_ms']:.1f} ms/token; relax the target, shorten the context or use a faster device."
        )
    if t.tokens_s is not None:
        best = ok.loc[ok["devices_needed"].idxmin()]
        return f"Fewest devices for {t.tokens_s:,.0f} tokens/s: {int(best['devices_needed'])} x {best['device']}."
    best = ok.loc[ok["total_tokens_s"].idxmax()]
    return (
        f"Most tokens/s per replica: {best['device']} ({best['total_tokens_s']:,.0f} tokens/s at batch "
        f"{best['batch']:,})."
    )
