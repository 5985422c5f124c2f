"""How well measured attention predicts a head configuration nobody measured: leave one
configuration out.

For each device with shipped attention tables (perfmodel.latency.attention_table) and each
of its software stacks, every measured (heads, KV heads) configuration of head size 128 is
predicted from the others only, at its measured points up to batch 256 and kv_len 32768
(decode: one query over kv_len cached tokens; prefill: kv_len causal queries), and compared
with its measurement. Points of a few microseconds, where launch overhead dominates, are
included: `under_20us` counts them and `median_20us+` is the median without them.
`outside` counts points no other configuration covers (an extrapolation).

`python -m perfmodel.attention_check` prints the median and p90 of |predicted / measured - 1|
per device, stack and phase, and the configuration predicted worst (by its median).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.hardware.specs import resolve_spec
from perfmodel.latency.attention_table import AttentionTable, attention_devices, attention_stacks, attention_table
from perfmodel.models.operators import Phase

MAX_BATCH = 256
MAX_LEN = 32768
TINY_S = 20e-6  # below this a kernel's time is mostly launch overhead


def leave_one_config_out(
    table: AttentionTable, phase: str, max_batch: int = MAX_BATCH, max_len: int = MAX_LEN
) -> pd.DataFrame:
    """One row per measured point of each configuration, predicted without that
    configuration: time_s (measured), predicted_s, outside."""
    kernels = table.kernels(phase)
    out = []
    for (heads, kv_heads), grid in kernels.grids.items():
        batch, length, seconds = grid.points()
        keep = (batch <= max_batch) & (length <= max_len)
        if not keep.any():
            continue
        batch, length, seconds = batch[keep], length[keep], seconds[keep]
        predicted, outside = kernels.without(heads, kv_heads).predict(batch, length, heads, kv_heads)
        out.append(
            pd.DataFrame(
                {
                    "device": table.device,
                    "stack": table.stack,
                    "phase": phase,
                    "num_heads": heads,
                    "num_kv_heads": kv_heads,
                    "batch": batch,
                    "kv_len": length,
                    "time_s": seconds,
                    "predicted_s": predicted,
                    "outside": outside,
                }
            )
        )
    result = pd.concat(out, ignore_index=True)
    result["error"] = result["predicted_s"] / result["time_s"] - 1
    return result


def summary(result: pd.DataFrame) -> pd.DataFrame:
    def stats(group: pd.DataFrame) -> pd.Series:
        error = group["error"].abs()
        longer = error[group["time_s"] >= TINY_S]
        per_config = error.groupby([group["num_heads"], group["num_kv_heads"]]).median()
        heads, kv_heads = per_config.idxmax()
        return pd.Series(
            {
                "configs": len(per_config),
                "points": len(group),
                "under_20us": int((group["time_s"] < TINY_S).sum()),
                "outside": int(group["outside"].sum()),
                "median": f"{np.median(error):.1%}",
                "p90": f"{np.quantile(error, 0.9):.1%}",
                "median_20us+": f"{np.median(longer):.1%}" if len(longer) else "-",
                "worst_config": f"{heads}x{kv_heads} {per_config.max():.1%}",
            }
        )

    keys = ["device", "stack", "phase"]
    return result.groupby(keys, sort=False).apply(stats, include_groups=False).reset_index()


@dataclass(frozen=True)
class AttentionCheckOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    gpu: tuple[str, ...] | None = field(
        default=None, metadata=shared(options.gpu, many=True, default="every device with shipped attention tables")
    )
    stack: str | None = field(
        default=None,
        metadata=option(
            "--stack",
            "the software stack whose measurements to check: vllm, sglang, trtllm (the newest of the engine) or an "
            "exact stack such as vllm-0.24.0 (default: every stack with attention tables)",
            metavar="ENGINE[-VERSION]",
        ),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.attention_check", description=__doc__.split("\n\n")[0])
    add_options(p, AttentionCheckOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(AttentionCheckOptions, build_parser().parse_args(argv))
    measured = attention_devices()
    devices = [resolve_spec(d, None).key for d in args.gpu] if args.gpu else measured
    missing = [d for d in devices if d not in measured]
    if missing:
        raise PerfkitError(
            f"--gpu {' '.join(missing)}: no shipped attention tables; devices with them: {', '.join(measured)}"
        )
    results = []
    for device in devices:
        for stack in [args.stack] if args.stack else attention_stacks(device):
            table = attention_table(device, stack, "bf16")
            # a phase the stack did not time, or timed at one configuration, has nothing to leave out
            phases = [p for p in (Phase.DECODE, Phase.PREFILL) if table.serves(p) and len(table.kernels(p).grids) > 1]
            results += [leave_one_config_out(table, phase) for phase in phases]
    table = summary(pd.concat(results, ignore_index=True))
    print(
        "Leave one head configuration out (head size 128): each measured heads x KV heads predicted from the others "
        f"at its\nmeasured points up to batch {MAX_BATCH} and kv_len {MAX_LEN}; |predicted / measured - 1|, "
        "measured = aiconfigurator-core's tables:"
    )
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
