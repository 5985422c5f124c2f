"""Import aiconfigurator-core's measured GEMM, attention and NCCL tables for the systems the
toolkit uses (perfmodel.measured.aiconfigurator says what becomes a row) into

    <out>/<device>/aiconfigurator/<engine>-<version>/{gemm,generation_attention,context_attention,custom_all_reduce}.parquet
    <out>/<device>/aiconfigurator/<engine>-<version>/{gemm_quantized,generation_attention_fp8_kv,context_attention_fp8_kv}.parquet
    <out>/<device>/aiconfigurator/nccl-<version>/{all_reduce,all_gather}.parquet

beside a provenance.json per folder. The tables come from the installed package
(`pip install 'medusa-perfkit[aiconfigurator]'`) or from a copy of its `systems/data` folder.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.measured.aiconfigurator import FOLDER, PACKAGE, SYSTEMS
from perfmodel.measured.aiconfigurator_package import Collection, collections, compact_tables

LICENCE = "Apache-2.0 (profilers/measurements/aiconfigurator-LICENSE)"


def installed_data() -> tuple[Path, str]:
    """The installed package's data folder and version, without importing the package (its
    native extension is not needed to read its tables)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.origin:
        raise PerfkitError(
            f"{PACKAGE} is not installed: pip install 'medusa-perfkit[aiconfigurator]', "
            "or give --data DIR (a copy of its systems/data folder) and --package-version"
        )
    return Path(spec.origin).parent / "systems" / "data", importlib.metadata.version(PACKAGE)


@dataclass(frozen=True)
class Written:
    path: Path
    rows: int
    stack: str


def write_collection(collection: Collection, device: str, out: Path, package_version: str) -> list[Written]:
    """The kept tables of one collection, zstd parquet, beside a provenance.json naming the
    package, system, engine, version, licence and the package file each table came from."""
    folder = out / device / FOLDER / collection.stack
    written = []
    for name, rows in compact_tables(collection, package_version).items():
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.parquet"
        rows.to_parquet(path, index=False, compression="zstd")
        written.append(Written(path, len(rows), collection.stack))
    if written:
        provenance = folder / "provenance.json"
        known = json.loads(provenance.read_text()) if provenance.exists() else {}
        known.update(
            {
                "package": f"{PACKAGE} {package_version}",
                "system": collection.system,
                "engine": collection.engine,
                "version": collection.serves or collection.version,
                "licence": LICENCE,
            }
        )
        c = collection
        origin = f"aiconfigurator_core/systems/data/{c.system}/{c.kind}/{c.engine}/{c.version}"
        known.setdefault("tables", {}).update({w.path.stem: origin for w in written})
        provenance.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return written


def import_systems(data: Path, package_version: str, systems, out: Path, log=print) -> list[Written]:
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise PerfkitError(f"unknown system(s) {', '.join(unknown)}; imported: {', '.join(SYSTEMS)}")
    written = []
    for system in systems:
        for collection in collections(data, system):
            done = write_collection(collection, SYSTEMS[system], out, package_version)
            for one in done:
                log(f"{system} {collection.stack}: {one.rows} rows -> {one.path}")
            written += done
    return written
