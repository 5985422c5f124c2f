"""Import public measured GPU operator profiles into data-contract rows.

    python -m profilers.imports vidur FILE... --gpu NAME --out FILE.csv
    python -m profilers.imports aiconfigurator [--systems SYSTEM ...] [--out DIR]
    python -m profilers.imports campaign FOLDER [--out DIR]

Vidur's profiles: profilers.import_vidur says how each row becomes a data-contract row.
aiconfigurator-core's tables: profilers.import_aiconfigurator. A campaign of this project's
own (python -m profilers.campaign) is kept as the torch stack of its device:
profilers.campaign_stack says how.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import POSITIONAL, add_options, option, read_options, shared
from perfmodel.measured.aiconfigurator import SYSTEMS as AIC_SYSTEMS
from perfmodel.measured.contract import write_table
from perfmodel.measured.store import MEASUREMENTS_DIR
from perfmodel.measured.vidur import VIDUR_COMMIT
from profilers.campaign_stack import campaign_stack
from profilers.import_aiconfigurator import PACKAGE, import_systems, installed_data
from profilers.import_vidur import import_vidur


@dataclass(frozen=True)
class VidurImport:
    """`vidur`'s options, each declared once (perfmodel.cli.fields)."""

    files: tuple[Path, ...] = field(
        default=(), metadata=option(POSITIONAL, "Vidur mlp.csv profile(s)", nargs="+", type=Path, metavar="FILE")
    )
    gpu: str = field(default="", metadata=shared(options.gpu, required=True))
    out: Path = field(
        default=None,
        metadata=shared(
            options.out, default=None, what="the imported rows, a .csv or .parquet file", metavar="FILE", required=True
        ),
    )
    run_id: str | None = field(
        default=None,
        metadata=option("--run-id", "run id of every row (default: vidur@<commit>:compute/<device>/<model>/mlp.csv)"),
    )
    commit: str = field(
        default=VIDUR_COMMIT,
        metadata=option("--commit", "the Vidur commit the files come from, cited in the default run id"),
    )


@dataclass(frozen=True)
class AiconfiguratorImport:
    """`aiconfigurator`'s options (as VidurImport)."""

    systems: tuple[str, ...] = field(
        default=tuple(AIC_SYSTEMS),
        metadata=option(
            "--systems",
            f"aiconfigurator systems (default: {' '.join(AIC_SYSTEMS)})",
            nargs="+",
            metavar="SYSTEM",
        ),
    )
    data: Path | None = field(
        default=None,
        metadata=option(
            "--data",
            "a copy of the package's systems/data folder (default: the installed package's)",
            type=Path,
            metavar="DIR",
        ),
    )
    package_version: str | None = field(
        default=None, metadata=option("--package-version", "the package version the --data folder comes from")
    )
    out: Path = field(
        default=MEASUREMENTS_DIR,
        metadata=shared(
            options.out,
            default="profilers/measurements",
            what="the measurements folder (<device>/aiconfigurator/...)",
            value=MEASUREMENTS_DIR,
        ),
    )


@dataclass(frozen=True)
class CampaignImport:
    """`campaign`'s options (as VidurImport)."""

    folders: tuple[Path, ...] = field(
        default=(),
        metadata=option(
            POSITIONAL,
            "the campaign's --out folder, then any later GPU checks (--stage gpu-check) of the same device and torch: "
            "a point timed in both keeps the check's CUDA-graph timing",
            nargs="+",
            type=Path,
            metavar="FOLDER",
        ),
    )
    out: Path = field(
        default=MEASUREMENTS_DIR,
        metadata=shared(
            options.out,
            default="profilers/measurements",
            what="the measurements folder (<device>/torch/torch-<version>/)",
            value=MEASUREMENTS_DIR,
        ),
    )


# Each source: its options, its one-line help and its description.
SOURCES = {
    "vidur": (
        VidurImport,
        "Vidur's compute profiles (<device>/<model>.mlp.csv or <device>/<model>/mlp.csv)",
        "Import Vidur mlp.csv profiles as measured data-contract rows.",
    ),
    "aiconfigurator": (
        AiconfiguratorImport,
        "aiconfigurator-core's GEMM, attention and NCCL tables (profilers/import_aiconfigurator.py)",
        "Import aiconfigurator-core's measured tables as data-contract rows, per device and stack.",
    ),
    "campaign": (
        CampaignImport,
        "a GPU campaign's folder as the torch stack of its device (profilers/campaign_stack.py)",
        "Keep a campaign's GEMM and attention rows as the stack torch-<version> of its device: the reference "
        "decoder's own kernels, for its own predictions.",
    ),
}


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.imports", description=__doc__.split("\n\n")[0])
    sources = p.add_subparsers(dest="source", required=True, metavar="SOURCE")
    for name, (declared, said, described) in SOURCES.items():
        add_options(sources.add_parser(name, help=said, description=described), declared)
    return p


def import_campaign(args: CampaignImport) -> int:
    stack = campaign_stack(*args.folders)
    folder = stack.write(args.out)
    rows, left_out = stack.provenance["rows"], stack.provenance["left_out"]
    print(f"{folder}: {', '.join(f'{name} {count} rows' for name, count in rows.items())}")
    print(f"left out: {left_out['gemm']} GEMM and {left_out['attention']} attention rows {left_out['why']}")
    return 0


def import_aiconfigurator_tables(args: AiconfiguratorImport) -> int:
    if args.data is None:
        data, version = installed_data()
    elif not args.package_version:
        raise PerfkitError("--data needs --package-version: the provenance names the version the tables come from")
    else:
        data, version = args.data, args.package_version
    written = import_systems(data, version, args.systems, args.out)
    print(f"{len(written)} tables, {sum(w.rows for w in written)} rows, from {PACKAGE} {version}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parsed = build_parser().parse_args(argv)
    args = read_options(SOURCES[parsed.source][0], parsed)
    if isinstance(args, AiconfiguratorImport):
        return import_aiconfigurator_tables(args)
    if isinstance(args, CampaignImport):
        return import_campaign(args)
    if args.out.suffix not in (".csv", ".parquet"):
        raise PerfkitError(f"--out {args.out}: use a .csv or .parquet file name")
    imported = [import_vidur(path, args.gpu, args.run_id, args.commit) for path in args.files]
    for one in imported:
        print(one.summary())
    out = write_table(pd.concat([one.rows for one in imported], ignore_index=True), args.out)
    print(f"{out}: {sum(len(one.rows) for one in imported)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
