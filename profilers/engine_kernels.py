"""python -m profilers.engine_kernels: time on this GPU the kernels whose engine pricing the
toolkit derives rather than reads, beside what it predicts for them.

- The LM head past the GEMM grids' last column: Llama-3's 4096 x 128256 weight, whole and
  split eight ways over the vocabulary (16032 columns), at 1-512 token rows. The grids stop
  at n = 65536, so the latency source scales the last column and floors the result at the
  weight's bytes over the datasheet bandwidth (perfmodel.latency.gemm_grid).
- The residual add and RMSNorm after it: op by op (torch eager, as the reference decoder
  runs it: about eight kernels) and as one (torch.compile fuses them, as the engines'
  fused_add_rms_norm does), sixteen calls to a graph,
  at hidden 4096 and 8192, 1-512 tokens; the engine stacks price one `add_norm` kernel by
  the roofline fitted to their GEMM grid (perfmodel.latency.fusion).

Every call is timed inside a CUDA graph (profilers.timer.time_cuda_graph), as an engine
replays its decoding steps, with several operand copies so that weights are read from HBM.
Rows go to --csv with the device's identity; the table printed last puts each beside
the prediction of the device's engine stacks where it ships their tables (vLLM, TRT-LLM).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.outputs import writable_file, write_csv
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, read_options, shared
from perfmodel.latency.source import latency_source
from perfmodel.measured.aiconfigurator import shipped_stacks
from perfmodel.models.config import load_model
from perfmodel.models.operators import Matmul
from profilers.device import check_device, cuda_info
from profilers.timer import TimerConfig, time_cuda_graph

TOKENS = (1, 8, 32, 128, 512)
TIMER = TimerConfig(warmup=3, min_reps=20, max_reps=200, budget_s=0.5)
STACKS = ("vllm", "trtllm")


def lm_head_rows(torch, tokens, copies: int = 3) -> list[dict]:
    model = load_model("llama-3-8b")
    rows = []
    for split in (1, 8):
        n = model.shard(split).vocab_per_device
        weights = [torch.randn(model.hidden_size, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for m in tokens:
            x = torch.randn(m, model.hidden_size, device="cuda", dtype=torch.bfloat16)
            calls = [lambda x=x, w=w: x @ w for w in weights]
            seconds = time_cuda_graph(calls, TIMER).median_s
            rows.append(dict(kernel="lm_head", split=split, m=m, k=model.hidden_size, n=n, time_s=seconds))
        del weights
    return rows


def add_norm_rows(torch, tokens) -> list[dict]:
    def add_norm(x, residual, weight):
        total = x + residual
        variance = total.float().pow(2).mean(-1, keepdim=True)
        return (total.float() * torch.rsqrt(variance + 1e-6)).to(total.dtype) * weight, total

    fused = torch.compile(add_norm, fullgraph=True)
    rows = []
    for hidden in (4096, 8192):
        weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        for m in tokens:
            # sixteen calls to a graph: one replay's own launch (about 10 us on an H100) would swamp one call
            pairs = [(torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2)) for _ in range(16)]
            pairs = [tuple(p) for p in pairs]
            for kind, fn in (("add_norm_eager", add_norm), ("add_norm_compiled", fused)):
                calls = [lambda fn=fn, x=x, r=r, w=weight: fn(x, r, w) for x, r in pairs]
                seconds = time_cuda_graph(calls, TIMER).median_s
                rows.append({"kernel": kind, "split": 1, "m": m, "k": hidden, "n": hidden, "time_s": seconds})
    return rows


def predicting_stacks(device: str | None) -> list[str]:
    """The engine stacks whose imported tables the device ships (none for a device the toolkit does not know)."""
    shipped = {s.engine for s in shipped_stacks(device)} if device else set()
    return [stack for stack in STACKS if stack in shipped]


def predictions(rows: pd.DataFrame, device: str) -> pd.DataFrame:
    """Each row's prediction by the engine stacks' latency sources (their latency labels say how)."""
    model = load_model("llama-3-8b")
    out = rows.copy()
    for stack in predicting_stacks(device):
        predicted = []
        for row in rows.itertuples():
            if row.kernel == "lm_head":
                source = latency_source(device, model.shard(row.split), "bf16", stack=stack)
                predicted.append(float(source.gemm_time(Matmul(1, row.m, row.k, row.n, weight=True))))
            else:
                shaped = model if row.k == 4096 else load_model("llama-2-70b")
                source = latency_source(device, shaped, "bf16", stack=stack)
                predicted.append(float(source.op_time("add_norm", "decode", row.m, 1024, 1)))
        out[f"predicted_{stack}_s"] = predicted
    return out


@dataclass(frozen=True)
class EngineKernelsOptions:
    """The command's one option (perfmodel.cli.fields)."""

    csv: Path = field(
        default=None,
        metadata=shared(options.csv, what="the rows measured, with the device, driver, torch and CUDA", required=True),
    )


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.engine_kernels", description=__doc__.split("\n\n")[0])
    add_options(p, EngineKernelsOptions)
    return p


def main(argv: list[str] | None = None) -> int:
    args = read_options(EngineKernelsOptions, build_parser().parse_args(argv))
    writable_file(args.csv, "--csv file")
    check_device("cuda")  # one line where there is no CUDA device
    import torch

    info, _ = cuda_info()
    rows = pd.DataFrame(lm_head_rows(torch, TOKENS) + add_norm_rows(torch, TOKENS))
    driver = info.details.get("driver", "")
    rows = rows.assign(device=info.name, driver=driver, torch=torch.__version__, cuda=torch.version.cuda)
    if predicting_stacks(info.spec_key):
        rows = predictions(rows, info.spec_key)
    write_csv(rows, args.csv)
    shown = rows.drop(columns=["device", "driver", "torch", "cuda"])
    print(f"{info.name}, driver {driver}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(shown.to_string(index=False, float_format=lambda v: f"{v * 1e6:.1f}"))
    print(f"times in us; wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
