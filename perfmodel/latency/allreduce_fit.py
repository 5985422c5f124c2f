"""The ring all-reduce model against the measured tables: its latency and efficiency per
interconnect fitted on Vidur's, or for a link Vidur never measured (NVLink 5) on NCCL's (fit_ring, fit_all; stored as
perfmodel.latency.allreduce.RING_CONSTANTS), its error per table and worker count against
Vidur's (model_errors, compare_tables) and NCCL's (nccl_errors, also at the message sizes a
decoding step all-reduces, decode_sizes), and Vidur's tables against NCCL's (stack_ratios);
`python -m perfmodel.allreduce_compare` prints them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import find_spec, load_all_specs
from perfmodel.latency.allreduce import DECODE_BYTES, all_reduce_source
from perfmodel.latency.allreduce_ring import RING_CONSTANTS, RingAllReduce, RingConstants
from perfmodel.latency.allreduce_tables import NCCL, VIDUR, measured_tables, nccl_source
from perfmodel.measured.vidur import SHIPPED_TABLES, read_table, table_path
from perfmodel.models.config import load_model

SPLIT_BYTES = 1024**2  # errors are also reported below / from 1 MiB
# The messages of a decoding step (decode_sizes): these models' hidden sizes (llama-7b to
# llama-2-70b: 4096-8192), batches, and query tokens per sequence (a plain step, Medusa trees
# of 16 and 64 candidates), fp16 activations.
DECODE_MODELS = ("llama-7b", "llama-13b", "llama-33b", "llama-2-70b")
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_QUERY_TOKENS = (1, 16, 64)
# What each interconnect's RING_CONSTANTS are fitted on.
RING_FIT_PLAN = {
    # interconnect: (device, topology, link GB/s both directions as the datasheet gives it, workers)
    "nvlink3": ("a100-sxm", "dgx", 600.0, (2, 4, 8)),
    "nvlink4": ("h100-sxm", "dgx", 900.0, (2, 4, 8)),
    # Vidur measured no Blackwell: the B200's NCCL table (aiconfigurator's, through NVSwitch)
    "nvlink5": ("b200", NCCL, 1800.0, (2, 4, 8)),
    # The pairwise node's 4-GPU ring crosses PCIe between its NVLink pairs, so its slowest hop
    # is a PCIe x16 link: its rows time a PCIe ring (Gen4 for A100; Gen5 assumed for H100).
    "pcie4": ("a100-sxm", "pairwise_nvlink", 64.0, (4,)),
    "pcie5": ("h100-sxm", "pairwise_nvlink", 128.0, (4,)),
}


def _decode_rows(table: pd.DataFrame, workers=None, sizes: tuple[float, float] = DECODE_BYTES) -> pd.DataFrame:
    rows = table[(table["devices_per_node"] == table["num_workers"]) & table["bytes"].between(*sizes)]
    return rows if workers is None else rows[rows["num_workers"].isin(workers)]


def fit_ring(
    table: pd.DataFrame, link_gb_s: float, workers=None, sizes: tuple[float, float] = DECODE_BYTES
) -> RingConstants:
    """Latency per step and efficiency of the ring model that best fits a table's single-node
    rows in `sizes` (bytes), by least squares on relative error: t = a x 2(n-1) + b x
    2(n-1)/n x bytes / (link_gb_s / 2), efficiency = 1 / b. A negative latency is refitted at 0."""
    rows = _decode_rows(table, workers, sizes)
    if rows.empty:
        raise PerfkitError("no single-node table rows in the size range to fit the ring model on")
    n = rows["num_workers"].to_numpy(dtype=float)
    t = rows["time_s"].to_numpy(dtype=float)
    steps = 2 * (n - 1)
    transfer = 2 * (n - 1) / n * rows["bytes"].to_numpy(dtype=float) / (link_gb_s * 1e9 / 2)
    (latency, inverse_eff), *_ = np.linalg.lstsq(np.c_[steps / t, transfer / t], np.ones_like(t), rcond=None)
    if latency < 0:
        latency, inverse_eff = 0.0, float(np.sum(transfer / t) / np.sum((transfer / t) ** 2))
    topologies = ", ".join(sorted(set(rows["topology"])))
    counts = "/".join(map(str, sorted(set(rows["num_workers"]))))
    fitted_on = f"{topologies}, {counts} GPUs, {link_gb_s:g} GB/s"
    return RingConstants(float(latency), float(1 / inverse_eff), fitted_on, int(n.max()))


def model_errors(table: pd.DataFrame, source, sizes: tuple[float, float] = DECODE_BYTES) -> pd.DataFrame:
    """Per worker count: the relative error of `source` (model / measured - 1) over a table's
    single-node rows in `sizes`: rows, median and p90 of |error|, median signed error, and
    the median signed error below and from SPLIT_BYTES (the table has far more rows above:
    Vidur's sizes are evenly spaced in bytes, while most decoding messages are below)."""
    out = []
    for workers, rows in _decode_rows(table, sizes=sizes).groupby("num_workers"):
        err = np.asarray(source.time(rows["bytes"].to_numpy(), int(workers))) / rows["time_s"].to_numpy() - 1
        small = rows["bytes"].to_numpy() < SPLIT_BYTES
        out.append(
            {
                "workers": int(workers),
                "rows": len(rows),
                "median_abs_err": float(np.median(np.abs(err))),
                "p90_abs_err": float(np.quantile(np.abs(err), 0.9)),
                "median_err": float(np.median(err)),
                "median_err_small": float(np.median(err[small])) if small.any() else np.nan,
                "median_err_large": float(np.median(err[~small])) if (~small).any() else np.nan,
            }
        )
    return pd.DataFrame(out)


def compare_tables(sizes: tuple[float, float] = DECODE_BYTES) -> pd.DataFrame:
    """The ring model of each shipped device (its spec, fitted constants) against each of its
    tables, per worker count; and each PCIe fit against the rows it was fitted on."""
    out = []
    for device, tables in SHIPPED_TABLES.items():
        model = RingAllReduce.for_spec(find_spec(device))
        for topology, vidur in tables.items():
            errors = model_errors(read_table(table_path(device, topology)), model, sizes)
            errors.insert(0, "model", f"{find_spec(device).interconnect} {model.link_gb_s:g} GB/s")
            errors.insert(0, "table", vidur)
            out.append(errors)
    for interconnect, (device, topology, link, workers) in RING_FIT_PLAN.items():
        if not interconnect.startswith("pcie"):
            continue
        fit = RING_CONSTANTS[interconnect]
        model = RingAllReduce(link, fit.latency_s, fit.efficiency, interconnect)
        table = read_table(table_path(device, topology))
        errors = model_errors(table[table["num_workers"].isin(workers)], model, sizes)
        errors.insert(0, "model", f"{interconnect} {link:g} GB/s")
        errors.insert(0, "table", SHIPPED_TABLES[device][topology])
        out.append(errors)
    return pd.concat(out, ignore_index=True)


def nccl_rows(device: str) -> pd.DataFrame:
    """A device's default NCCL all-reduce tables as single-node rows of Vidur's columns
    (what fit_ring and model_errors read), the topology column naming the NCCL stack."""
    source = nccl_source(device, NCCL)
    frames = [
        pd.DataFrame({"num_workers": workers, "devices_per_node": workers, "bytes": sizes, "time_s": times}).assign(
            topology=source.tables[workers].stack
        )
        for workers, (sizes, times, _) in source.curves.items()
    ]
    return pd.concat(frames, ignore_index=True)


def fit_table(device: str, topology: str) -> pd.DataFrame:
    """The rows RING_FIT_PLAN fits an interconnect on: a Vidur topology's table, or NCCL's."""
    return nccl_rows(device) if topology == NCCL else read_table(table_path(device, topology))


def fit_all(sizes: tuple[float, float] = DECODE_BYTES) -> dict[str, RingConstants]:
    """fit_ring for every interconnect of RING_FIT_PLAN on the shipped tables."""
    fits = {}
    for interconnect, (device, topology, link, workers) in RING_FIT_PLAN.items():
        fits[interconnect] = fit_ring(fit_table(device, topology), link, workers, sizes)
    return fits


def significant(x: float, digits: int = 3) -> float:
    """`x` rounded to `digits` significant digits (how the fitted constants are stored)."""
    return 0.0 if x == 0 else round(x, digits - 1 - math.floor(math.log10(abs(x))))


def decode_sizes() -> np.ndarray:
    """Bytes of one tensor-parallel all-reduce of a decoding step, batch x query tokens x
    hidden x 2 (perfmodel.latency.allreduce.tp_comm_time_per_step), over DECODE_MODELS,
    DECODE_BATCHES and DECODE_QUERY_TOKENS: the distinct sizes, ascending (8 KiB-64 MiB)."""
    hidden = [load_model(name).hidden_size for name in DECODE_MODELS]
    tokens = np.multiply.outer(DECODE_BATCHES, DECODE_QUERY_TOKENS).ravel()
    return np.unique(np.multiply.outer(tokens, hidden).ravel() * 2).astype(float)


def _abs_stats(err: np.ndarray, prefix: str = "") -> dict:
    return {
        f"{prefix}median_abs_err": float(np.median(np.abs(err))),
        f"{prefix}p90_abs_err": float(np.quantile(np.abs(err), 0.9)),
        f"{prefix}median_err": float(np.median(err)),
    }


def nccl_errors() -> pd.DataFrame:
    """The ring model of every device with NCCL tables against each of them, per worker
    count (error = model / measured - 1): over the table's own sizes (every measured size,
    512 B-512 MiB), and at decode_sizes(), where `measured` is the table interpolated (as the
    planner reads it). `default` marks the table a device uses by default."""
    out = []
    at = decode_sizes()
    for key in load_all_specs():
        tables = [t for t in measured_tables(key) if t.stack.startswith(NCCL + "-")]
        if not tables:
            continue
        # against every table, past the rings it prices too (max_workers): that is where it is judged
        model = dataclasses.replace(RingAllReduce.for_spec(find_spec(key)), max_workers=None)
        default = nccl_source(key, NCCL).tables
        for table in tables:
            source = nccl_source(key, table.stack)
            for workers, (sizes, times, _) in source.curves.items():
                out.append(
                    {
                        "device": key,
                        "table": table.stack,
                        "default": default.get(workers) == table,
                        "model": f"{find_spec(key).interconnect} {model.link_gb_s:g} GB/s",
                        "workers": workers,
                        "sizes": len(sizes),
                        **_abs_stats(model.time(sizes, workers) / times - 1),
                        **_abs_stats(model.time(at, workers) / source.time(at, workers) - 1, "decode_"),
                    }
                )
    return pd.DataFrame(out)


def stack_ratios() -> pd.DataFrame:
    """Vidur's DGX tables against the NCCL tables a device uses by default, at decode_sizes():
    per device and worker count both measure, the median, smallest and largest ratio
    Vidur / NCCL, and the ratio at the smallest and largest decode size."""
    out = []
    at = decode_sizes()
    for key in SHIPPED_TABLES:
        vidur, nccl = all_reduce_source(key, stack=VIDUR), all_reduce_source(key, stack=NCCL)
        for workers in sorted(set(vidur.workers) & set(nccl.workers)):
            ratio = vidur.time(at, workers) / nccl.time(at, workers)
            out.append(
                {
                    "device": key,
                    "vidur": SHIPPED_TABLES[key][vidur.tables[workers].topology],
                    "nccl": nccl.tables[workers].stack,
                    "workers": workers,
                    "median_ratio": float(np.median(ratio)),
                    "min_ratio": float(ratio.min()),
                    "max_ratio": float(ratio.max()),
                    "ratio_smallest": float(ratio[0]),
                    "ratio_largest": float(ratio[-1]),
                }
            )
    return pd.DataFrame(out)
