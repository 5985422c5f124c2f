"""How well the calibrated latency predicts shapes it never saw: leave one model out.

For each measured device, and each of its imported profiles (one model, every
tensor-parallel shard of it): build the device's latency source from the other profiles
only, and predict this profile's linear ops (qkv, o, gate_up, down) up to 1024 tokens.
Shapes the other profiles happen to share (e.g. o of two models with the same hidden size)
come back as measured, as they would in use.

Three predictions of an unseen shape are compared (perfmodel.latency.source uses the last):
`calibrated` (the roofline fitted to the other profiles x their staircase), `grid` (the
device's engine grid, perfmodel.latency.gemm_grid, at the other profiles' level) and
`combined` (their geometric mean). The held-out model's rows are never used; the grid is
another harness's, measured on the whole device.

`python -m perfmodel.latency_check` prints the median and p90 absolute error per device and
held-out model, and each grid's offset from the profiles (their time / the grid's on the same
GEMMs: how much slower the profiles' harness measures). `--bounds` adds two oracles that are
allowed to look at the held-out rows, and so bound what any prediction of their form could
reach without them (see `oracle_bounds`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, options, positive_int, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.hardware.specs import resolve_spec
from perfmodel.latency.gemm_grid import default_grid, gemm_grid, stack_names
from perfmodel.latency.gemm_table import GemmTable, gemm_rows
from perfmodel.latency.source import measured_devices
from perfmodel.measured.store import stored_profiles

MAX_TOKENS = 1024
METHODS = ("calibrated", "grid", "combined")


def leave_one_model_out(device: str, max_tokens: int = MAX_TOKENS) -> pd.DataFrame:
    """One row per (held-out profile, GEMM shape, token count): measured and predicted time."""
    spec = resolve_spec(device, None)
    grid = default_grid(spec.key, "fp16")
    profiles = {p.stem: pd.read_csv(p) for p in stored_profiles(spec.key)}
    out = []
    for held_out, rows in profiles.items():
        train = pd.concat([r for name, r in profiles.items() if name != held_out], ignore_index=True)
        if not len(train):
            continue
        table = GemmTable.of(train, spec, "fp16", f"all but {held_out}")
        test = gemm_rows(rows)
        test = test[test["m"] <= max_tokens]
        for (k, n), part in test.groupby(["k", "n"]):
            m = part["m"].to_numpy(dtype=float)
            calibrated = table.predict(k, n, m, spec, "fp16")
            seen = table.measured(k, n)
            on_grid = calibrated if grid is None or seen else table.grid_predict(k, n, m, grid)
            out.append(
                part.assign(
                    device=spec.key,
                    held_out=held_out,
                    trained_on=", ".join(sorted(set(profiles) - {held_out})),
                    calibrated_s=calibrated,
                    grid_s=on_grid,
                    combined_s=np.sqrt(calibrated * on_grid),
                    seen=seen,
                )
            )
    result = pd.concat(out, ignore_index=True)
    for method in METHODS:
        result[f"{method}_error"] = result[f"{method}_s"] / result["time_s"] - 1
    result["predicted_s"], result["error"] = result["combined_s"], result["combined_error"]
    return result


def grid_offsets(device: str) -> pd.DataFrame:
    """Per engine grid of a device: the median of the profiles' time over the grid's on the
    same GEMMs (every measured shape and token count)."""
    spec = resolve_spec(device, None)
    table = GemmTable.of(pd.concat([pd.read_csv(p) for p in stored_profiles(spec.key)]), spec, "fp16", "profiles")
    rows = []
    for stack in stack_names(spec.key):
        grid = gemm_grid(spec.key, stack, "fp16") if stack != "vidur" else None
        if grid is not None:
            rows.append({"device": spec.key, "grid": stack, "profiles / grid (median)": round(table.offset(grid), 3)})
    return pd.DataFrame(rows)


def summary(result: pd.DataFrame) -> pd.DataFrame:
    def stats(group):
        out = {"rows": int(len(group)), "shapes_seen": int(group.drop_duplicates(["k", "n"])["seen"].sum())}
        for method in METHODS:
            e = group[f"{method}_error"].abs()
            out[f"{method}_median"] = float(np.median(e))
            out[f"{method}_p90"] = float(np.quantile(e, 0.9))
        return pd.Series(out)

    return result.groupby(["device", "held_out", "trained_on"]).apply(stats, include_groups=False).reset_index()


ORACLE_SWEEPS = 20  # alternating-median passes of the two-way fit; it settles in a few


def oracle_bounds(result: pd.DataFrame, max_tokens: int = MAX_TOKENS) -> pd.DataFrame:
    """Two oracles per device and held-out model, each fitted on the held-out rows themselves:

    - `per shape x token count`: `combined` times one factor per held-out GEMM shape and one per
      token count (a two-way fit of log measured / predicted by alternating medians): the best
      any correction that is separable in shape and tokens could do;
    - `best other staircase`: each held-out shape's own curve over tokens replaced by the other
      model's best-matching shape's curve (chosen by its p90 on the held-out rows), levelled by
      their median ratio: the best any borrowing of a measured staircase could do.

    What either leaves is staircase that belongs to the held-out shape alone."""
    rows = []
    for (device, held_out), part in result.groupby(["device", "held_out"]):
        log_ratio = np.log(part["time_s"] / part["combined_s"])
        shape = part["k"].astype(str) + "x" + part["n"].astype(str)
        by_tokens = log_ratio * 0
        for _ in range(ORACLE_SWEEPS):
            by_shape = (log_ratio - by_tokens).groupby(shape).transform("median")
            by_tokens = (log_ratio - by_shape).groupby(part["m"]).transform("median")
        two_way = np.abs(np.exp(log_ratio - by_shape - by_tokens) - 1)
        borrowed = best_other_staircase(part, device, held_out, max_tokens)
        for name, error in (("per shape x token count", two_way), ("best other staircase", borrowed)):
            rows.append(
                {
                    "device": device,
                    "held_out": held_out,
                    "oracle": name,
                    "median": float(np.median(error)),
                    "p90": float(np.quantile(error, 0.9)),
                }
            )
    return pd.DataFrame(rows)


def best_other_staircase(held: pd.DataFrame, device: str, held_out: str, max_tokens: int) -> np.ndarray:
    """|error| of each held-out shape's curve against the best levelled curve of another model's."""
    others = [gemm_rows(pd.read_csv(p)) for p in stored_profiles(device) if p.stem != held_out]
    train = pd.concat(others, ignore_index=True)
    curves = {
        shape: rows.set_index("m")["time_s"] for shape, rows in train[train["m"] <= max_tokens].groupby(["k", "n"])
    }
    errors = []
    for _, part in held.groupby(["k", "n"]):
        measured = part.set_index("m")["time_s"]
        best = None
        for curve in curves.values():
            theirs = curve.reindex(measured.index)
            if theirs.isna().any():
                continue
            log_ratio = np.log(measured / theirs)
            error = np.abs(np.exp(log_ratio - log_ratio.median()) - 1).to_numpy()
            if best is None or np.quantile(error, 0.9) < np.quantile(best, 0.9):
                best = error
        if best is not None:
            errors.append(best)
    return np.concatenate(errors)


@dataclass(frozen=True)
class LatencyCheckOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    gpu: tuple[str, ...] | None = field(
        default=None, metadata=shared(options.gpu, many=True, default="every measured device with profiles")
    )
    max_tokens: int = field(
        default=MAX_TOKENS,
        metadata=option("--max-tokens", "largest token count checked (default 1024)", type=positive_int),
    )
    bounds: bool = field(
        default=False,
        metadata=option(
            "--bounds",
            "also print two oracles fitted on the held-out rows: how far any prediction of their form could get",
            action="store_true",
        ),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.latency_check", description=__doc__.split("\n\n")[0])
    add_options(p, LatencyCheckOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(LatencyCheckOptions, build_parser().parse_args(argv))
    profiled = [key for key in measured_devices() if stored_profiles(key)]
    devices = args.gpu or profiled
    unmeasured = [d for d in devices if not stored_profiles(resolve_spec(d, None).key)]
    if unmeasured:
        raise PerfkitError(
            f"--gpu {' '.join(unmeasured)}: no stored profiles to check; profiled: {', '.join(profiled)}"
        )
    result = pd.concat([leave_one_model_out(d, args.max_tokens) for d in devices], ignore_index=True)
    table = summary(result)
    shown = table.copy()
    for column in [c for c in table.columns if c.endswith(("_median", "_p90"))]:
        shown[column] = [f"{v:.1%}" for v in table[column]]
    print(f"Leave one model out, linear ops up to {args.max_tokens} tokens (|predicted / measured - 1|):")
    print(shown.drop(columns=["trained_on"]).to_string(index=False))
    print("\nThe latency source predicts an unseen shape by `combined`. Each grid's offset from the profiles:")
    print(pd.concat([grid_offsets(d) for d in devices], ignore_index=True).to_string(index=False))
    if args.bounds:
        bounds = oracle_bounds(result, args.max_tokens)
        for column in ("median", "p90"):
            bounds[column] = [f"{v:.1%}" for v in bounds[column]]
        print("\nOracles fitted on the held-out rows themselves (not allowed in use; they bound what a prediction")
        print("of their form could reach):")
        print(bounds.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
