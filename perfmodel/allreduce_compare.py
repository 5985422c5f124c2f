"""Command line: the ring all-reduce model against the measured tables (Vidur's and NCCL's),
the two kinds of table against each other, the model's fitted constants, and the import of
Vidur's tables. A thin entry module over perfmodel.latency.allreduce_fit and
perfmodel.measured.vidur.

    python -m perfmodel.allreduce_compare [--compare]       # model error per table and worker count
    python -m perfmodel.allreduce_compare --fit             # refit latency and efficiency
    python -m perfmodel.allreduce_compare --import-vidur DIR   # rewrite the shipped tables
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.base.outputs import replaced_atomically
from perfmodel.cli import Parser, run
from perfmodel.cli.fields import add_options, option, read_options
from perfmodel.latency.allreduce import DECODE_BYTES
from perfmodel.latency.allreduce_fit import (
    DECODE_BATCHES,
    DECODE_MODELS,
    DECODE_QUERY_TOKENS,
    compare_tables,
    decode_sizes,
    fit_all,
    nccl_errors,
    significant,
    stack_ratios,
)
from perfmodel.latency.allreduce_ring import RING_CONSTANTS
from perfmodel.measured.vidur import SHIPPED_TABLES, import_vidur_all_reduce, table_path

WHAT = ("what", False)  # one of --compare, --fit, --import-vidur


@dataclass(frozen=True)
class AllreduceCompareOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    compare: bool = field(
        default=False,
        metadata=option(
            "--compare", "print the model's error per table (the default)", action="store_true", exclusive=WHAT
        ),
    )
    fit: bool = field(
        default=False,
        metadata=option(
            "--fit", "refit the ring latency and efficiency per interconnect", action="store_true", exclusive=WHAT
        ),
    )
    import_vidur: Path | None = field(
        default=None,
        metadata=option(
            "--import-vidur",
            "convert DIR/<topology>/all_reduce.csv (Vidur's data/profiling/network) into the shipped tables",
            metavar="DIR",
            type=Path,
            exclusive=WHAT,
        ),
    )


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m perfmodel.allreduce_compare",
        description="Ring all-reduce model vs the shipped measured tables (Vidur's, NCCL's), per table and worker "
        "count; Vidur's tables vs NCCL's.",
    )
    add_options(parser, AllreduceCompareOptions)
    return parser


def sizes_text() -> str:
    return f"{DECODE_BYTES[0] // 1024} KiB-{DECODE_BYTES[1] // 1024**2} MiB"


def print_compare() -> None:
    table = compare_tables()
    print(f"Ring model vs measured all-reduce, single-node rows, messages {sizes_text()} (error = model/measured - 1)")
    print("bias = median signed error; <1 MiB and >=1 MiB: median signed error of the rows below / from 1 MiB")
    print(
        f"{'table':<21} {'model':<16} {'GPUs':>4} {'rows':>4} {'median|err|':>11} {'p90|err|':>8} {'bias':>7} "
        f"{'<1 MiB':>7} {'>=1 MiB':>7}"
    )
    for r in table.itertuples():
        print(
            f"{r.table:<21} {r.model:<16} {r.workers:>4} {r.rows:>4} {r.median_abs_err:>11.1%} "
            f"{r.p90_abs_err:>8.1%} {r.median_err:>+7.1%} {r.median_err_small:>+7.1%} {r.median_err_large:>+7.1%}"
        )


def decode_text() -> str:
    sizes = decode_sizes()
    return (
        f"{len(sizes)} sizes {sizes[0] / 1024:g} KiB-{sizes[-1] / 1024**2:g} MiB: batch "
        f"{DECODE_BATCHES[0]}-{DECODE_BATCHES[-1]} x {'/'.join(map(str, DECODE_QUERY_TOKENS))} query tokens x hidden "
        f"of {', '.join(DECODE_MODELS)} x 2 bytes"
    )


def print_nccl() -> None:
    table = nccl_errors()
    print()
    print("Ring model vs NCCL all-reduce tables (aiconfigurator-core), error = model/measured - 1; * = default table")
    print("all sizes: every measured size (512 B-512 MiB); decode: the table interpolated at the decode sizes,")
    print(f"  {decode_text()}")
    print(
        f"{'device':<12} {'table':<13} {'model':<17} {'GPUs':>4} {'sizes':>5} {'median|err|':>11} {'p90|err|':>8} "
        f"{'bias':>7} | {'decode: median|err|':>19} {'p90|err|':>8} {'bias':>7}"
    )
    for r in table.itertuples():
        name = r.table + ("*" if r.default else "")
        print(
            f"{r.device:<12} {name:<13} {r.model:<17} {r.workers:>4} {r.sizes:>5} {r.median_abs_err:>11.1%} "
            f"{r.p90_abs_err:>8.1%} {r.median_err:>+7.1%} | {r.decode_median_abs_err:>19.1%} "
            f"{r.decode_p90_abs_err:>8.1%} {r.decode_median_err:>+7.1%}"
        )


def print_ratios() -> None:
    table = stack_ratios()
    sizes = decode_sizes()
    print()
    print("Vidur's DGX tables vs the default NCCL tables at the decode sizes (ratio = Vidur / NCCL, both measured)")
    print(
        f"{'device':<9} {'vidur':<9} {'nccl':<12} {'GPUs':>4} {'median':>6} {'min':>5} {'max':>5} "
        f"{f'{sizes[0] / 1024:g} KiB':>6} {f'{sizes[-1] / 1024**2:g} MiB':>6}"
    )
    for r in table.itertuples():
        print(
            f"{r.device:<9} {r.vidur:<9} {r.nccl:<12} {r.workers:>4} {r.median_ratio:>6.2f} {r.min_ratio:>5.2f} "
            f"{r.max_ratio:>5.2f} {r.ratio_smallest:>6.2f} {r.ratio_largest:>6.2f}"
        )


def print_fit() -> None:
    print(f"Ring fit t = 2(n-1) x latency + 2(n-1)/n x bytes / (efficiency x link/2), messages {sizes_text()}")
    for interconnect, fit in fit_all().items():
        stored = RING_CONSTANTS[interconnect]
        print(
            f"{interconnect:<8} latency {fit.latency_s * 1e6:.3g} us/step, efficiency {fit.efficiency:.3g} "
            f"(stored {stored.latency_s * 1e6:.3g} us, {stored.efficiency:.3g}) on {fit.fitted_on}"
        )
        print(f"         as stored: RingConstants({significant(fit.latency_s):.3g}, {significant(fit.efficiency):.3g})")


def import_vidur(source_dir: Path) -> None:
    # every table read before the first is written: a missing or bad one leaves the shipped ones
    # as they were, not half of them replaced
    tables = {
        table_path(device, topology): import_vidur_all_reduce(source_dir / vidur / "all_reduce.csv", vidur)
        for device, topologies in SHIPPED_TABLES.items()
        for topology, vidur in topologies.items()
    }
    for out, table in tables.items():
        out.parent.mkdir(parents=True, exist_ok=True)
        with replaced_atomically(out) as temporary:
            table.to_csv(temporary, index=False, float_format="%.6g")
        print(f"wrote {out} ({len(table)} rows)")


def main(argv: list[str] | None = None) -> int:
    args = read_options(AllreduceCompareOptions, build_parser().parse_args(argv))
    if args.fit:
        print_fit()
    elif args.import_vidur:
        import_vidur(args.import_vidur)
    else:
        print_compare()
        print_nccl()
        print_ratios()
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
