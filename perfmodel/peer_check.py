"""python -m perfmodel.peer_check: the project's static-batch TPOT and TTFT beside NVIDIA
aiconfigurator's, point by point, with the ratios' median and worst.

Both read the same measured GEMM, attention and collective tables (aiconfigurator-core
0.12.0); they differ in how a step is composed: which kernels run, fused or not, how the
tables are interpolated and floored, which collective each engine runs. Needs the optional
peer: pip install 'medusa-perfkit[aiconfigurator]'. --quick is a few points (seconds).
docs/peer-check.md gives what it printed and why the project keeps its own number where the
two still part.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import replaced_atomically, writable_file, write_csv
from perfmodel.cli import Parser, options, run
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.cli.parser import positive_int
from perfmodel.hardware.specs import resolve_spec
from perfmodel.peer.aiconfigurator_peer import BACKENDS, SYSTEMS, check_installed
from perfmodel.peer.compare import (
    DEFAULT_BATCHES,
    DEFAULT_DEVICES,
    DEFAULT_MODELS,
    DEFAULT_STACKS,
    MODEL_SETS,
    compare,
    component_ratios,
    grid,
    summarize,
    ttft_collectives,
)

QUICK = dict(devices=("h100-sxm",), stacks=("trtllm",), models=(DEFAULT_MODELS[1][0], (8,)), batches=(1, 16))


@dataclass(frozen=True)
class PeerCheckOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    gpu: tuple[str, ...] | None = field(
        default=None,
        metadata=shared(
            options.gpu, many=True, default=f"{' '.join(DEFAULT_DEVICES)}; the peer has tables of {', '.join(SYSTEMS)}"
        ),
    )
    models: str = field(
        default="bf16",
        metadata=option(
            "--models",
            "which checkpoints: bf16 (Llama-3.1-8B and 70B, default devices h100-sxm a100-sxm), fp8 (Qwen3-32B-FP8 "
            "in fp8 blocks and per tensor, Llama-3.1-70B-Instruct-FP8; default devices h100-sxm h200 b200), moe "
            "(Qwen3-30B-A3B in bf16 and fp8, gpt-oss-20b, Qwen3-235B-A22B; the same devices), nvfp4 "
            "(Qwen3-235B-A22B-NVFP4 on the b200) or mla (DeepSeek-V3 on 8 h200 or b200) (default %(default)s)",
            choices=tuple(MODEL_SETS),
        ),
    )
    stack: tuple[str, ...] = field(
        default=tuple(DEFAULT_STACKS),
        metadata=option("--stack", f"engine stacks (default: {' '.join(DEFAULT_STACKS)})", nargs="+", choices=BACKENDS),
    )
    batch: tuple[int, ...] = field(
        default=tuple(DEFAULT_BATCHES),
        metadata=option(
            "--batch",
            f"batch sizes (default: {' '.join(map(str, DEFAULT_BATCHES))})",
            nargs="+",
            type=positive_int,
        ),
    )
    prompt_len: int = field(
        default=1024, metadata=option("--prompt-len", "prompt tokens (default 1024)", type=positive_int)
    )
    response_len: int = field(
        default=256, metadata=option("--response-len", "output tokens, >= 2 (default 256)", type=positive_int)
    )
    quick: bool = field(
        default=False,
        metadata=option(
            "--quick",
            "Llama-3.1-70B on 8 H100s in TensorRT-LLM at batches 1 and 16 only (a few seconds)",
            action="store_true",
        ),
    )
    csv: Path | None = field(
        default=None, metadata=shared(options.csv, what="every point's row (both sides, ratios, components)")
    )
    markdown: Path | None = field(
        default=None,
        metadata=option(
            "--markdown",
            "also write what it prints to this Markdown page",
            type=options.output_file,
            metavar="FILE",
        ),
    )
    no_progress: bool = field(default=False, metadata=option("--no-progress", "no progress bar", action="store_true"))


def build_parser() -> Parser:
    p = Parser(prog="python -m perfmodel.peer_check", description=__doc__.split("\n\n")[0])
    add_options(p, PeerCheckOptions)
    return p


# What each model set's header says of its precision.
PRECISION_SAID = {
    "bf16": "bf16",
    "fp8": "each checkpoint in the formats its files declare, on both sides",
    "moe": "each checkpoint in the formats its files declare (bf16; Qwen3-30B-A3B-FP8's fp8-block; gpt-oss's MXFP4 "
    "experts), the experts split as the project's tables priced them and routed power_law_1.2, on both sides",
    "nvfp4": "NVFP4 weights and experts over an fp8 KV cache, as the checkpoint's files declare, on both sides",
    "mla": "DeepSeek-V3's fp8-block weights and experts over a bf16 KV cache, as its files declare, the experts split "
    "as the project's tables priced them and routed power_law_1.01 (the peer's DeepSeek routing), on both sides",
}


def report(rows: pd.DataFrame, prompt_len: int, response_len: int, precision: str = "bf16") -> list[str]:
    """What the command prints: every point, the ratios' statistics, where the two part."""
    columns = ["device", "stack", "model", "tp", "batch", "tpot_ms", "peer_tpot_ms", "tpot_ratio"]
    shown = rows[[*columns, "ttft_ms", "peer_ttft_ms", "ttft_ratio"]].assign(
        peer=rows["peer_oom"].map({True: "OOM", False: ""})
    )
    s = summarize(rows)
    by_tp = ", ".join(f"TP{tp} {ratio:.3f}" for tp, ratio in s.tpot_by_tp.items())
    number = lambda v: f"{v:.3f}"  # noqa: E731
    return [
        f"Static batches of {prompt_len}-token prompts and {response_len}-token responses, {precision}: the project "
        "(predicted) beside NVIDIA aiconfigurator 0.12.0's static estimate (predicted), both from "
        "aiconfigurator-core 0.12.0's measured tables; ratio = project / peer; OOM: the peer finds the batch out "
        "of memory (left out of the statistics):",
        shown.to_string(index=False, float_format=number),
        "",
        f"TPOT over {s.points} points the peer fits in memory: median |ratio - 1| {s.tpot_median:.1%}, worst "
        f"{s.tpot_worst:.1%} ({s.tpot_worst_at}); median ratio by degree: {by_tp}",
        f"TTFT: median |ratio - 1| {s.ttft_median:.1%}, worst {s.ttft_worst:.1%} ({s.ttft_worst_at})",
        "",
        "Where TPOT parts, by component (median project / peer of its share, median difference per step):",
        component_ratios(rows).to_string(index=False, float_format=number),
        "",
        "The prefill's collectives (all-reduces, logits gather, an MoE layer's dispatch), median ms of a TTFT:",
        ttft_collectives(rows).to_string(index=False, float_format=number),
        "",
        *(f"the project's latency on {device} {stack}: {label}" for (device, stack), label in latency_labels(rows)),
    ]


def latency_labels(rows: pd.DataFrame):
    """Each device and stack's latency label, at its largest degree (the one naming the collectives)."""
    widest = rows.sort_values("tp", kind="stable").groupby(["device", "stack"], sort=False).tail(1)
    return [((r.device, r.stack), r.latency) for r in widest.itertuples()]


def markdown(lines: list[str], argv: list[str]) -> str:
    command = " ".join(["python -m perfmodel.peer_check", *argv])
    return (
        "# The peer check: the project beside NVIDIA aiconfigurator\n\n"
        f"Written by `{command}` (aiconfigurator 0.12.0, aiconfigurator-core 0.12.0); what it means: "
        "[../peer-check.md](../peer-check.md).\n\n```\n" + "\n".join(lines) + "\n```\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = read_options(PeerCheckOptions, build_parser().parse_args(argv))
    csv = writable_file(args.csv, "--csv file") if args.csv else None
    page = writable_file(args.markdown, "--markdown file") if args.markdown else None
    models, default_devices = MODEL_SETS[args.models]
    devices = [resolve_spec(name, None).key for name in args.gpu] if args.gpu else list(default_devices)
    unknown = [d for d in devices if d not in SYSTEMS]
    if unknown:
        raise PerfkitError(
            f"--gpu {' '.join(unknown)}: the peer has no tables of it; choose from: {', '.join(SYSTEMS)}"
        )
    check_installed()
    if args.quick:
        points, left_out = grid(QUICK["devices"], QUICK["stacks"], (QUICK["models"],), QUICK["batches"])
    else:
        points, left_out = grid(devices, args.stack, models, args.batch)
    rows = pd.DataFrame(
        [
            compare(point, args.prompt_len, args.response_len)
            for point in tqdm(points, desc="points", unit="point", disable=args.no_progress, file=sys.stderr)
        ]
    )
    lines = report(rows, args.prompt_len, args.response_len, PRECISION_SAID[args.models])
    if left_out:
        lines += [
            "",
            "Left out (the project prices a tensor-parallel degree from measured collectives only):",
            *left_out,
        ]
    print("\n".join(lines))
    if page:
        with replaced_atomically(page) as temporary:
            temporary.write_text(markdown(lines, [a for a in argv if a != "--no-progress"]))
        print(f"wrote {page}")
    if csv:
        write_csv(rows, csv)
        print(f"wrote {len(rows)} rows to {csv}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
