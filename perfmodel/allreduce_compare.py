"""Command line: the ring all-reduce model against the measured tables, its fitted constants,
and the import of Vidur's tables. A thin entry module over perfmodel.latency.allreduce_fit
and perfmodel.measured.vidur.

    python -m perfmodel.allreduce_compare [--compare]       # model error per table and worker count
    python -m perfmodel.allreduce_compare --fit             # refit latency and efficiency
    python -m perfmodel.allreduce_compare --import-vidur DIR   # rewrite the shipped tables
"""

from __future__ import annotations

from pathlib import Path

from perfmodel.cli import Parser, run
from perfmodel.latency.allreduce import DECODE_BYTES, RING_CONSTANTS
from perfmodel.latency.allreduce_fit import compare_tables, fit_all, significant
from perfmodel.measured.vidur import SHIPPED_TABLES, import_vidur_all_reduce, table_path


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m perfmodel.allreduce_compare",
        description="Ring all-reduce model vs the shipped measured tables (Vidur), per topology and worker count.",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--compare", action="store_true", help="print the model's error per table (the default)")
    what.add_argument("--fit", action="store_true", help="refit the ring latency and efficiency per interconnect")
    what.add_argument(
        "--import-vidur",
        metavar="DIR",
        type=Path,
        help="convert DIR/<topology>/all_reduce.csv (Vidur's data/profiling/network) into the shipped tables",
    )
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
    for device, tables in SHIPPED_TABLES.items():
        for topology, vidur in tables.items():
            table = import_vidur_all_reduce(source_dir / vidur / "all_reduce.csv", vidur)
            out = table_path(device, topology)
            out.parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(out, index=False, float_format="%.6g")
            print(f"wrote {out} ({len(table)} rows)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.fit:
        print_fit()
    elif args.import_vidur:
        import_vidur(args.import_vidur)
    else:
        print_compare()
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
