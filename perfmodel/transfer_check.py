"""How well GEMM latency transfers to a device nobody measured: leave one device out.

Each device with an engine's GEMM grid (aiconfigurator-core's vLLM, SGLang and TRT-LLM
harnesses) is predicted from the other devices' grids of the same engine only, by
perfmodel.latency.transfer (sustained tensor clock, bandwidth share of the memory class, SM
waves, donors weighted by similarity), and compared with its own measured grid points: every
measured (not hole-filled) point with m <= 8192 tokens and n, k in 1024-65536, the widths of the
model presets' projections at TP 1-8. The datasheet roofline (public efficiency defaults) on
the same points is the "before". The engines' versions differ between devices (a100-sxm was
measured in vLLM 0.14.0, the others in 0.24.0); the table names each device's stack.

`python -m perfmodel.transfer_check` prints the median and p90 of |predicted / measured - 1|
per engine and device, then what each device without a grid borrows; --ablation compares the
shipped method with the variants it was chosen over.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.outputs import write_csv
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.hardware.specs import load_all_specs
from perfmodel.latency.gemm_grid import ENGINES
from perfmodel.latency.transfer import (
    CHECK_MAX_M,
    CHECK_MAX_NK,
    CHECK_MIN_NK,
    VARIANTS,
    engine_stacks,
    leave_one_device_out,
    transferred_gemm,
)

TARGET = 0.10  # the acceptance line: median <= 10% per device


def check_table(engines, dtype: str = "bf16") -> pd.DataFrame:
    """One row per engine and held-out device."""
    rows = []
    for engine in engines:
        for e in leave_one_device_out(engine, dtype):
            rows.append(
                {
                    "engine": engine,
                    "device": e.device,
                    "stack": e.stack,
                    "points": e.points,
                    "median": e.median,
                    "p90": e.p90,
                    "bias": e.bias,
                    "datasheet_median": e.datasheet_median,
                    "datasheet_p90": e.datasheet_p90,
                    "donors (weight)": e.donors,
                }
            )
    return pd.DataFrame(rows)


def borrowers_table(engines, dtype: str = "bf16") -> pd.DataFrame:
    """What each device without a grid of an engine borrows: donors, weights and share."""
    rows = []
    for engine in engines:
        measured = engine_stacks(engine)
        for key, spec in load_all_specs().items():
            if key in measured:
                continue
            transfer = transferred_gemm(spec, engine, dtype)
            if transfer is None:
                continue
            rows.append(
                {
                    "engine": engine,
                    "device": key,
                    "memory": spec.memory_type or "?",
                    "sustained TFLOP/s": round(spec.sustained_flops("bf16") / 1e12, 1),
                    "bandwidth share (from)": f"{transfer.share:.2f} ({transfer.share_basis})",
                    "donors (weight)": ", ".join(f"{d.spec.key} {d.weight:.2f}" for d in transfer.donors),
                }
            )
    return pd.DataFrame(rows)


def ablation_table(engines, dtype: str = "bf16") -> pd.DataFrame:
    """Per method variant and engine: the worst and the mean device median."""
    rows = []
    for name, method in VARIANTS.items():
        row = {"method": name}
        for engine in engines:
            medians = [e.median for e in leave_one_device_out(engine, dtype, method)]
            row[f"{engine} worst"] = f"{max(medians):.1%}"
            row[f"{engine} mean"] = f"{sum(medians) / len(medians):.1%}"
        rows.append(row)
    return pd.DataFrame(rows)


def shown(table: pd.DataFrame) -> pd.DataFrame:
    out = table.copy()
    for column in ("median", "p90", "datasheet_median", "datasheet_p90"):
        out[column] = [f"{v:.1%}" for v in table[column]]
    out["bias"] = [f"{v:+.1%}" for v in table["bias"]]
    return out


@dataclass(frozen=True)
class TransferCheckOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    stack: tuple[str, ...] = field(
        default=tuple(ENGINES),
        metadata=option(
            "--stack",
            f"the engines whose grids are checked: {', '.join(ENGINES)} (default: all); each device's stack of it "
            "(engine and version) is named in the table",
            nargs="+",
            choices=ENGINES,
            metavar="ENGINE",
        ),
    )
    ablation: bool = field(
        default=False,
        metadata=option(
            "--ablation", "also compare the shipped method with the variants it was chosen over", action="store_true"
        ),
    )
    csv: Path | None = field(default=None, metadata=shared(options.csv, what="the per-device table"))


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.transfer_check", description=__doc__.split("\n\n")[0])
    add_options(p, TransferCheckOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(TransferCheckOptions, build_parser().parse_args(argv))
    table = check_table(args.stack)
    print(
        f"Leave one device out: each device's GEMM grid predicted from the other devices' only "
        f"(|predicted / measured - 1| over measured points with m <= {CHECK_MAX_M}, n and k in "
        f"{CHECK_MIN_NK}-{CHECK_MAX_NK}; datasheet_* = the datasheet roofline on the same points):"
    )
    print(shown(table).to_string(index=False))
    over = table[table["median"] > TARGET]
    met = len(table) - len(over)
    print(f"\nMedian <= {TARGET:.0%}: {met} of {len(table)} device-engine pairs", end="")
    print(
        "."
        if over.empty
        else "; over: " + ", ".join(f"{r.device} {r.engine} {r.median:.1%}" for r in over.itertuples())
    )
    print("\nDevices without a grid borrow (perfmodel.latency.transfer):")
    print(borrowers_table(args.stack).to_string(index=False))
    if args.ablation:
        print("\nThe shipped method against its variants (device medians):")
        print(ablation_table(args.stack).to_string(index=False))
    if args.csv:
        write_csv(table, args.csv)
        print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
