"""python -m perfmodel.speedup: the paper's three simulations (Appendix G.3) and the
draft-model comparison on any device, drawn (PNG) and written (CSV), for the Medusa heads,
EAGLE or a draft model (--drafter), or the best of them per batch and context (--drafter
all). The model is perfmodel.planning.simulations (the drafters: perfmodel.planning.drafters,
drafter_choice); the figures (Medusa's) are reports.speedup_figures.
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import ExitStack

import pandas as pd

from perfmodel.base.drafter_kind import DrafterChoice, DrafterKind
from perfmodel.base.dtypes import check_dtype, default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.output_locks import claimed_dir
from perfmodel.base.outputs import write_csv, write_file
from perfmodel.cli import Parser
from perfmodel.cli.fields import add_options, read_options
from perfmodel.cli.speedup_options import DEFAULT_OUT, SpeedupOptions
from perfmodel.latency.attention_table import write_measured_attention
from perfmodel.latency.choice import LatencyMode
from perfmodel.latency.pipeline import HostCosts
from perfmodel.latency.source import view_latency
from perfmodel.latency.step import StepFlavor
from perfmodel.measured.ngram_host import ngram_host_cost
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.models.drafter_config import drafter_model
from perfmodel.planning.capacity import PlanRequest
from perfmodel.planning.chain_choice import best_chains, chain_lines
from perfmodel.planning.deployment import DeploymentChoices, resolve
from perfmodel.planning.drafter_choice import choice_lines
from perfmodel.planning.drafter_point import (
    DRAFTER_POINT_COLUMNS,
    DraftedShape,
    drafter_point,
    drafter_point_lines,
    drafter_words,
    point_drafter,
    tokens_per_step,
    with_draft_steps,
)
from perfmodel.planning.drafters import DRAFTERS, Drafter, drafters_for
from perfmodel.planning.simulation_summary import best_trees, optima_side_by_side, summary_lines
from perfmodel.planning.simulations import choose_devices, device_table, draft_model_table, optima
from perfmodel.planning.step_point import POINT_COLUMNS, point_lines, step_point
from reports.figure_cache import figure_cache
from reports.metrics_rates import metrics_rates
from reports.point_steps import point_steps
from reports.render import Renderer
from reports.speedup_degree import planned_deployment, point_plan_request
from reports.speedup_figures import submit_speedup_figures


def build_parser() -> Parser:
    p = Parser(
        prog="python -m perfmodel.speedup",
        description="Medusa speedup and the best tree size: the paper's three simulations (Appendix G.3) on any "
        "device, and the draft-model comparison.",
    )
    add_options(p, SpeedupOptions)
    return p


def drafting_on(drafter: Drafter, own, choices: DeploymentChoices, device, args, flavors, host) -> Drafter:
    """The drafter on one device: a draft model of its own config drafting with its own steps,
    priced as the target's are (the same flavours, launch and host)."""
    if own is None or drafter.name != DrafterKind.DRAFT:
        return drafter
    (drafting,) = resolve(own, [device], choices)
    return with_draft_steps(drafter, point_steps(drafting, flavors, args.cuda_graph, args.launch, host))


def answer_best_chain(args, model, devices, flavors, drafter: Drafter, own: ModelConfig | None = None) -> int:
    """--best-chain: per batch the chain of 1 .. len(--position-rates) drafts of the highest
    speedup, and where speculation stops paying, on every device asked for."""
    frames = []
    for device in devices:
        dtype = args.dtype or default_dtype("cpu" if device.is_cpu else "cuda")
        request = point_plan_request(drafter.name, args.position_rates, args.draft_config)
        deployment, split = planned_deployment(model, device, DeploymentChoices(dtype, args.tp, args.latency), request)
        choices = DeploymentChoices(dtype, deployment.tp, args.latency)
        steps = point_steps(deployment, flavors)
        here = drafting_on(drafter, own, choices, device, args, flavors, None)
        rows = best_chains(steps, here, args.position_rates, args.context)
        rates = " ".join(f"{r:g}" for r in args.position_rates)
        print(
            f"{device.spec.name} ({device.spec.key}), {model.title}, {dtype}: predicted, context {args.context}, "
            f"{drafter.name}'s best chain per batch from its per-position acceptance {rates}"
        )
        for line in split:
            print(line)
        print(f"  latency: {rows['latency_model'].iloc[0]}")
        for line in chain_lines(rows):
            print(line)
        frames.append(rows.assign(device=device.spec.key, model=model.name, dtype=dtype))
    table = pd.concat(frames, ignore_index=True)
    if args.csv:
        write_csv(table, args.csv)
        print(f"csv: {args.csv} ({len(table)} rows)")
    return 0


def answer_point(args, model, devices, flavors, drafter: Drafter, own: ModelConfig | None = None) -> int:
    """--tree-size or --chain: one tree or chain at one batch and context, on every device
    asked for; own: a draft model's shapes (its config), priced on each device as the target is."""
    if args.acceleration is None:
        shape = (
            "--tree-size" if args.tree_size is not None else "--chain" if args.chain is not None else "--engine-tree"
        )
        raise PerfkitError(f"{shape} needs --acceleration (tokens accepted per step with that shape)")
    if args.engine_tree is not None and (args.tree_size is not None or args.chain is not None):
        raise PerfkitError("give the shape once: --engine-tree, --tree-size or --chain")
    shape = (
        DraftedShape.of_engine(args.engine_tree) if args.engine_tree else DraftedShape.of(args.tree_size, args.chain)
    )
    model.check_context(args.context, shape.tokens)  # every step flavour, as the traced one already refuses
    for given, option in ((args.cuda_graph, "--cuda-graph"), (args.launch, "--launch")):
        if given and StepFlavor.TRACED not in flavors:
            raise PerfkitError(
                f"{option} prices the traced step's launches: use --step traced or all (not {args.step})"
            )
    if args.host_dispatch is not None and args.launch not in (Launch.EAGER, Launch.STATIC):
        raise PerfkitError("--host-dispatch prices an eager or static step's host queue: give --launch eager or static")
    host = HostCosts.from_json(args.host_dispatch) if args.host_dispatch is not None else None
    medusa = drafter.name == DrafterKind.MEDUSA
    frames = []
    for device in devices:
        dtype = args.dtype or default_dtype("cpu" if device.is_cpu else "cuda")
        device.spec.peak_flops(dtype)
        request = point_plan_request(drafter.name, args.position_rates, args.draft_config)
        deployment, split = planned_deployment(model, device, DeploymentChoices(dtype, args.tp, args.latency), request)
        tp = deployment.tp
        steps = point_steps(deployment, flavors, args.cuda_graph, args.launch, host)
        here = drafting_on(drafter, own, DeploymentChoices(dtype, tp, args.latency), device, args, flavors, host)
        if medusa:  # the heads draft inside the step: one step of the tree's size
            rows = step_point(steps, args.batch, args.context, shape.tokens, args.acceleration)
            columns, what = POINT_COLUMNS, f"a {shape.tokens}-token tree"
        else:
            rows = drafter_point(steps, here, shape, args.batch, args.context, args.acceleration)
            columns = DRAFTER_POINT_COLUMNS
            who = drafter_words(here)
            what = f"{drafter.name} drafting {rows['shape'].iloc[0]}" + (f" ({who})" if who else "")
        rows = rows.assign(device=device.spec.key, model=model.name, dtype=dtype)[list(columns)]
        print(
            f"{device.spec.name} ({device.spec.key}), {model.title}, {dtype}: predicted, batch {args.batch}, context "
            f"{args.context}, {what} at acceleration {args.acceleration:g}"
            + (f", tensor parallel {tp}" if tp > 1 else "")
        )
        for line in split:
            print(line)
        print(f"  latency: {rows['latency_model'].iloc[0]}")
        for line in point_lines(steps, rows) if medusa else drafter_point_lines(rows):
            print(line)
        frames.append(rows)
    table = pd.concat(frames, ignore_index=True)
    if args.csv:
        write_csv(table, args.csv)
        print(f"csv: {args.csv} ({len(table)} rows)")
    return 0


def sweep_tracer():
    """The decoder's tracer for the traced simulations: each point traced once, contexts past
    the model's trained one too (simulation (c) runs to 8192 and marks them)."""
    from decoder.trace import StepTracer  # torch loads only when a step is traced

    return StepTracer(beyond_context=True)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = read_options(SpeedupOptions, build_parser().parse_args(argv))
    model = load_model(args.model).as_served(args.weight_format, args.kv_cache_dtype, args.moe_parallel, args.routing)
    if args.dtype:
        check_dtype(args.dtype)
    if args.metrics is not None:
        if args.position_rates is not None or args.acceleration is not None:
            raise PerfkitError("give one of --metrics, --position-rates or --acceleration: each gives the acceptance")
        args = dataclasses.replace(args, position_rates=metrics_rates(args.metrics))
        print(f"--metrics: per-position acceptance {' '.join(f'{r:.3f}' for r in args.position_rates)}")
    best_chain = args.best_chain
    if best_chain and (args.position_rates is None or args.tree_size or args.chain or args.acceleration):
        raise PerfkitError(
            "--best-chain searches the chains the per-position rates cover: give --position-rates R1 R2 ..., and "
            "neither --tree-size, --chain nor --acceleration"
        )
    if best_chain and args.drafter == DrafterKind.MEDUSA:
        raise PerfkitError("--best-chain prices a drafter's chains; the Medusa heads draft a tree inside the step")
    if args.position_rates is not None and not best_chain:
        if args.acceleration is not None:
            raise PerfkitError("give one of --acceleration or --position-rates: the rates give the tokens per step")
        accelerated = tokens_per_step(args.position_rates)
        if args.chain is not None and args.chain != len(args.position_rates):
            raise PerfkitError(
                f"--position-rates: {len(args.position_rates)} rate(s) for a chain of {args.chain} draft(s); give one "
                "rate per draft position"
            )
        chain = len(args.position_rates) if args.tree_size is None and args.chain is None else args.chain
        args = dataclasses.replace(args, acceleration=accelerated, chain=chain)
    point = args.tree_size is not None or args.chain is not None or args.engine_tree is not None or best_chain
    if args.acceleration is not None and not point:
        raise PerfkitError(
            "--acceleration is the tokens per step of one tree or chain: give its shape with --tree-size or --chain"
        )
    if point and args.drafter in (DrafterChoice.ALL, DrafterChoice.BEST):
        raise PerfkitError(f"--drafter {args.drafter}: one point is priced for one drafter ({', '.join(DrafterKind)})")
    if args.drafter == DrafterKind.MEDUSA:
        model.require_heads("there is no tree to price, plain decoding is its only step (--drafter eagle or draft)")
    if args.drafter == DrafterKind.MEDUSA and (args.draft_config is not None or args.engine_tree is not None):
        given = "--draft-config" if args.draft_config is not None else "--engine-tree"
        others = ", ".join(kind for kind in DrafterKind if kind != DrafterKind.MEDUSA)
        raise PerfkitError(
            f"{given} shapes a drafter outside the step (--drafter {others}); the Medusa heads are the model's own "
            "and draft its tree inside the step"
        )
    if args.draft_config is not None and not point:
        raise PerfkitError(
            "--draft-config prices one point's drafter: give --tree-size (or --chain) and --acceleration"
        )
    if point and args.drafter != DrafterKind.MEDUSA:
        kind = DrafterKind(args.drafter)
        own = None if args.draft_config is None else drafter_model(args.draft_config, kind, model)
        host = ngram_host_cost() if kind == DrafterKind.NGRAM else None
        drafter = point_drafter(kind, model, own, args.draft_cost, host)
        devices = choose_devices(args.gpu, args.spec, args.all)
        flavors = {"both": ("paper", "full"), "all": ("paper", "full", "traced")}.get(args.step, (args.step,))
        answer = answer_best_chain if best_chain else answer_point
        return answer(args, model, devices, flavors, drafter, own)
    if args.drafter not in (*DRAFTERS, DrafterChoice.ALL):
        raise PerfkitError(
            f"--drafter {args.drafter} is priced at one point, from its measured acceptance (no acceptance curve of "
            "it is shipped for the simulations): give --tree-size or --chain, and --acceleration or --position-rates"
        )
    drafters = drafters_for(args.drafter, args.acceptance_rates, args.draft_alpha, args.draft_cost)
    acceptance = drafters[0].choice  # None for the draft model alone
    devices = choose_devices(args.gpu, args.spec, args.all)
    flavors = {"both": ("paper", "full"), "all": ("paper", "full", "traced")}.get(args.step, (args.step,))
    if point:
        return answer_point(args, model, devices, flavors, drafters[0])
    for given, option in (
        (args.cuda_graph, "--cuda-graph"),
        (args.launch, "--launch"),
        (args.host_dispatch, "--host-dispatch"),
    ):
        if given:
            raise PerfkitError(
                f"{option} prices one point's traced step: give --tree-size (or --chain) and --acceleration"
            )
    draft = draft_model_table(cost_ratio=args.draft_cost)
    tracer = sweep_tracer() if StepFlavor.TRACED in flavors else None  # one for every device: a shard is traced once

    # Each output folder is claimed before the simulations fill it, and held to the end: a
    # second run into it is refused (perfmodel.base.output_locks.claimed_dir).
    with ExitStack() as held:
        planned, skipped, claimed = [], [], set()
        for device in devices:
            dtype = args.dtype or default_dtype("cpu" if device.is_cpu else "cuda")
            if args.all and dtype not in device.spec.peak_tflops:
                skipped.append(f"{device.spec.key} (no {dtype} peak)")
                continue
            device.spec.peak_flops(dtype)  # one clear line when the device lacks the dtype
            try:
                choices = DeploymentChoices(dtype=dtype, tensor_parallel=args.tp, latency=args.latency, tracer=tracer)
                request = PlanRequest(acceptance=drafters[0].acceptance)
                deployment, split = planned_deployment(model, device, choices, request)
                tp = deployment.tp
            except PerfkitError as exc:  # another --tp would hold the model: with --all, one device less
                if not args.all:
                    raise
                skipped.append(f"{device.spec.key} ({exc})")
                continue
            folder = f"{device.spec.key}-{model.name}-{dtype}" + (f"-tp{tp}" if tp > 1 else "")
            out = args.out if args.out and len(devices) == 1 else (args.out or DEFAULT_OUT) / folder
            root = args.out or out  # --out holds every device's folder
            if root not in claimed:
                held.enter_context(claimed_dir(root))
                claimed.add(root)
            table = device_table(deployment, flavors, drafters)
            compared = []
            # one drafter's optima against the datasheet's; the three drafters' would bury the choice
            if (
                len(drafters) == 1
                and view_latency(device, model.shard(tp), dtype, args.latency).mode != LatencyMode.DATASHEET
            ):
                datasheet = device_table(dataclasses.replace(deployment, latency="datasheet"), flavors, drafters)
                compared = optima_side_by_side(table, datasheet)
            planned.append((device, dtype, out, table, split, compared))

        if not planned:
            asked = f" in {args.dtype}" if args.dtype else ""
            raise PerfkitError(f"no device can run {model.name}{asked}; skipped: {', '.join(skipped)}")

        medusa = args.drafter == DrafterKind.MEDUSA  # the figures and best trees are Medusa's
        with Renderer(args.jobs, figure_cache()) as renderer:
            figures = [
                submit_speedup_figures(renderer, d, model, dtype, table, draft, acceptance) if medusa else {}
                for d, dtype, _, table, _, _ in planned
            ]
            for (device, dtype, out, table, split, compared), pngs in zip(planned, figures):
                out.mkdir(parents=True, exist_ok=True)
                what = (
                    "the best drafter and tree per batch and context"
                    if args.drafter == DrafterChoice.ALL
                    else f"acceptance {drafters[0].describe()}"
                )
                print(f"{device.spec.name} ({device.spec.key}), {model.title}, {dtype}: predicted; {what}")
                print(f"  latency: {table['latency_model'].iloc[0]}")
                if args.drafter == DrafterChoice.ALL:
                    found = choice_lines(table, drafters)
                else:
                    found = summary_lines(device, dtype, table, draft)
                for line in split + found + compared:
                    print(line)
                written = []
                for name, png in pngs.items():
                    write_file(png(), out / f"{name}.png")
                    written.append(f"{name}.png")
                write_csv(draft, out / "draft-model.csv")
                written.append("draft-model.csv")
                if not device.is_cpu:
                    line = write_measured_attention(out, device.evidence, model.shard(tp), dtype, args.latency.stack)
                    if line:
                        print(line)
                if not args.csv:
                    write_csv(table, out / "speedup.csv")
                    written.append(f"speedup.csv ({len(table)} rows)")
                if medusa and acceptance.trees is not None:
                    trees = best_trees(optima(table), acceptance)
                    # one optimum per line: paths of top-ranks, the format engines read
                    lines = ",\n".join(f"  {json.dumps(t)}" for t in trees)
                    write_file(
                        f'{{"tree_model": {json.dumps(acceptance.trees.describe())},\n "optima": [\n{lines}\n ]}}\n',
                        out / "best-trees.json",
                    )
                    written.append("best-trees.json")
                print(f"  wrote {out}/: {', '.join(written)}")
        if args.csv:
            rows = pd.concat([t for _, _, _, t, _, _ in planned], ignore_index=True)
            write_csv(rows, args.csv)
            print(f"csv: {args.csv} ({len(rows)} rows)")
        if skipped:
            print(f"skipped: {', '.join(skipped)}")
        print(f"done in {time.perf_counter() - started:.1f} s")
        return 0
