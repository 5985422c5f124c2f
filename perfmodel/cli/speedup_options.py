"""The options of python -m perfmodel.speedup, each declared once (perfmodel.cli.fields
generates its parser): the devices, the model and step, the draft-model comparison, where it
writes, and one step's shape for a point answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.cli import options, pricing_options
from perfmodel.cli.fields import along, option, shared
from perfmodel.cli.parser import number_in
from perfmodel.latency.choice import LatencyChoice
from perfmodel.planning.drafters import DEFAULT_DRAFT_ALPHA
from perfmodel.planning.simulations import DEFAULT_DRAFT_COST

DEFAULT_OUT = Path("perf-reports") / "speedup"
DEVICE = ("device", True)  # --gpu, --all or --spec: exactly one

cost_ratio = number_in(0.0, 1e3, ">= 0 (draft step time / target step time)")
acceptance_rate = number_in(0.0, 1.0, "from 0 to 1 (the share of drafts the target accepts)")


@dataclass(frozen=True)
class SpeedupOptions:
    gpu: list[str] | None = field(default=None, metadata=shared(options.gpu, exclusive=DEVICE, many=True))
    all: bool = field(
        default=False,
        metadata=option(
            "--all",
            "every device in hw_specs/ (devices without a peak for --dtype are skipped)",
            exclusive=DEVICE,
            action="store_true",
        ),
    )
    spec: list[Path] | None = field(default=None, metadata=shared(options.spec, exclusive=DEVICE, many=True))
    model: str = field(default="llama-7b", metadata=shared(options.model))
    dtype: str | None = field(default=None, metadata=shared(options.dtype))
    weight_format: str | None = field(default=None, metadata=shared(options.precision))
    kv_cache_dtype: str | None = field(default=None, metadata=along("weight_format"))
    moe_parallel: str | None = field(default=None, metadata=along("weight_format"))
    routing: str | None = field(default=None, metadata=along("weight_format"))
    step: str = field(
        default="both",
        metadata=shared(options.step, choices=("paper", "full", "traced", "both", "all"), default="both"),
    )
    latency: str | LatencyChoice = field(default="auto", metadata=shared(pricing_options.latency))  # parsed: a choice
    acceptance_rates: str | None = field(default=None, metadata=shared(options.acceptance_rates))
    draft_cost: float = field(
        default=DEFAULT_DRAFT_COST,
        metadata=option(
            "--draft-cost",
            f"draft-model step time / target step time for the comparison (default {DEFAULT_DRAFT_COST:g}: about a "
            "350M draft for a 7B target)",
            type=cost_ratio,
            metavar="C",
        ),
    )
    drafter: str = field(default="medusa", metadata=shared(options.drafter, choices=(*DrafterKind, "all")))
    draft_config: Path | None = field(
        default=None, metadata=shared(options.draft_config, use="with --tree-size, --chain or --best-chain")
    )
    draft_alpha: float = field(
        default=DEFAULT_DRAFT_ALPHA,
        metadata=option(
            "--draft-alpha",
            "with --drafter draft or all: the draft model's acceptance rate alpha, the chance the target accepts "
            f"each drafted token (default {DEFAULT_DRAFT_ALPHA:g}, the middle of the comparison's 0.6-0.9)",
            type=acceptance_rate,
            metavar="A",
        ),
    )
    out: Path | None = field(
        default=None,
        metadata=shared(
            options.out,
            default=f"{DEFAULT_OUT}/<device>-<model>-<dtype>; with several devices, one such subfolder of DIR each",
        ),
    )
    csv: Path | None = field(
        default=None, metadata=shared(options.csv, what="every device's rows", default="DIR/speedup.csv per device")
    )
    tree_size: int | None = field(
        default=None,
        metadata=shared(
            options.step_point,
            tree_use=": answer for that one tree instead of the simulations (plain and speculative step times, "
            "EAGLE's or a draft model's drafting and verification apart, overhead and speedup); with --drafter "
            "eagle or draft, the drafter's own tree of that size; needs --acceleration",
        ),
    )
    chain: int | None = field(
        default=None,
        metadata=option(
            "--chain",
            "answer for one chain of K drafts on one path (K + 1 tokens verified: vLLM's default shape) instead of "
            "the simulations; for any --drafter, instead of --tree-size; needs --acceleration",
            type=int,
            metavar="K",
        ),
    )
    engine_tree: tuple[str, ...] | None = field(
        default=None,
        metadata=option(
            "--engine-tree",
            "instead of --tree-size: an engine's own tree, SGLang's num_steps=S eagle_topk=K num_draft_tokens=N "
            "(--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens) for eagle, eagle3 "
            "or mtp; needs --acceleration",
            nargs="+",
            metavar="KEY=VALUE",
        ),
    )
    metrics: tuple[Path, ...] | None = field(
        default=None,
        metadata=option(
            "--metrics",
            "instead of --position-rates: a vLLM server's /metrics page (a file), the rates from its "
            "spec_decode counters (accepted per position over drafts); a second page, taken before a load, makes "
            "them the load's own",
            type=Path,
            nargs="+",
            metavar="PAGE",
        ),
    )
    position_rates: tuple[float, ...] | None = field(
        default=None,
        metadata=shared(
            options.position_rates,
            use="instead of --acceleration; the chain is one draft per rate unless --chain or --tree-size says "
            "otherwise",
        ),
    )
    best_chain: bool = field(
        default=False,
        metadata=option(
            "--best-chain",
            "with --position-rates: per batch (1 to 256) the chain of 1 to as many drafts as rates with the highest "
            "speedup, and the batch from which speculation stops paying, instead of one point",
            action="store_true",
        ),
    )
    batch: int = field(default=1, metadata=along("tree_size"))
    context: int = field(default=512, metadata=along("tree_size"))
    acceleration: float | None = field(default=None, metadata=shared(options.acceleration))
    cuda_graph: bool = field(default=False, metadata=shared(pricing_options.cuda_graph))
    launch: str | None = field(default=None, metadata=shared(options.launch, default=None))
    host_dispatch: Path | None = field(default=None, metadata=shared(pricing_options.host_dispatch))
    tp: int | None = field(default=1, metadata=shared(pricing_options.tp))
    jobs: int | None = field(default=None, metadata=shared(options.jobs))
