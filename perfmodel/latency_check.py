"""How well the calibrated latency predicts shapes it never saw: leave one model out.

For each measured device, and each of its imported profiles (one model, every
tensor-parallel shard of it): build the device's latency source from the other profiles
only, and predict this profile's linear ops (qkv, o, gate_up, down) up to 1024 tokens.
Shapes the other profiles happen to share (e.g. o of two models with the same hidden size)
come back as measured, as they would in use.

`python -m perfmodel.latency_check` prints the median and p90 absolute error per device and
direction.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import Parser, options, positive_int, run
from perfmodel.hardware.specs import resolve_spec
from perfmodel.latency.source import GemmTable, gemm_rows, measured_devices
from perfmodel.measured.store import stored_profiles

MAX_TOKENS = 1024


def leave_one_model_out(device: str, max_tokens: int = MAX_TOKENS) -> pd.DataFrame:
    """One row per (held-out profile, GEMM shape, token count): measured and predicted time."""
    spec = resolve_spec(device, None)
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
            predicted = table.predict(k, n, part["m"].to_numpy(dtype=float), spec, "fp16")
            out.append(
                part.assign(
                    device=spec.key,
                    held_out=held_out,
                    trained_on=", ".join(sorted(set(profiles) - {held_out})),
                    predicted_s=predicted,
                    seen=table.measured(k, n),
                )
            )
    result = pd.concat(out, ignore_index=True)
    result["error"] = result["predicted_s"] / result["time_s"] - 1
    return result


def summary(result: pd.DataFrame) -> pd.DataFrame:
    def stats(group):
        e = group["error"].abs()
        return pd.Series(
            {
                "rows": len(group),
                "shapes_seen": int(group.drop_duplicates(["k", "n"])["seen"].sum()),
                "median_error": float(np.median(e)),
                "p90_error": float(np.quantile(e, 0.9)),
            }
        )

    return result.groupby(["device", "held_out", "trained_on"]).apply(stats, include_groups=False).reset_index()


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.latency_check", description=__doc__.split("\n\n")[0])
    options.gpu(p, many=True, default="every measured device with profiles")
    p.add_argument(
        "--max-tokens", type=positive_int, default=MAX_TOKENS, help="largest token count checked (default 1024)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    devices = args.gpu or measured_devices()
    unmeasured = [d for d in devices if not stored_profiles(resolve_spec(d, None).key)]
    if unmeasured:
        raise PerfkitError(
            f"--gpu {' '.join(unmeasured)}: no stored profiles to check; measured: {', '.join(measured_devices())}"
        )
    table = summary(pd.concat([leave_one_model_out(d, args.max_tokens) for d in devices], ignore_index=True))
    shown = table.assign(
        median_error=[f"{v:.1%}" for v in table["median_error"]], p90_error=[f"{v:.1%}" for v in table["p90_error"]]
    )
    print(f"Leave one model out, linear ops up to {args.max_tokens} tokens (|predicted / measured - 1|):")
    print(shown.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
