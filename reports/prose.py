"""The report's sentences: what the numbers say, in words (the "At a glance" facts, the
introduction, the inputs and the notes built from the data)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pandas as pd

from perfmodel import simulations as speedup
from perfmodel.ablation import dense_against_sparse
from perfmodel.acceptance import fit_error
from perfmodel.latency_source import view_latency
from perfmodel.planning import PlanResult
from perfmodel.step import StepModel
from reports.report import FLAVORS, BuildConfig, Report
from reports.sources import ReportAcceptance


def intro_text(report: Report, validation: pd.DataFrame) -> str:
    """When and how the page was written, and which measured data it uses."""
    measured = []
    if report.view.measured is not None and len(report.view.measured):
        measured.append(f"{len(report.view.measured)} operator timings")
    if report.view.ceilings:
        measured.append("empirical ceilings")
    if report.latency is not None and report.latency.mode in ("measured", "calibrated"):
        measured.append(f"measured operator profiles ({report.latency.table.origin})")
    if report.latency is not None and report.latency.mode == "borrowed":
        measured.append(f"{report.latency.table.spec.key}'s measured operator profiles, borrowed (same architecture)")
    if report.acceptance.measured:
        measured.append("an acceptance record")
    if len(validation):
        measured.append("a closed-loop speedup run")
    have = (
        f"Measured data used: {', '.join(measured)}."
        if measured
        else (
            "No measured data for this device and model: every number here is predicted. "
            "Run python -m profilers.sweep on the device (--measurements FILE) "
            "and python -m decoder.measure (--acceptance FILE) to add measurements."
        )
    )
    return (
        f"Written {datetime.date.today().isoformat()} by medusa-perfkit (python -m reports build). "
        "Every figure and table says whether it shows "
        "predicted numbers (from the device's datasheet or measured ceilings through the latency model) "
        "or measured ones, and where both "
        f"exist, the error between them. {have}"
    )


def glance_facts(report: Report, sims: pd.DataFrame, planned: PlanResult | str, validation: pd.DataFrame) -> list[str]:
    """The "At a glance" sentences: ridge, whether to speculate, capacity, closed-loop error."""
    device = report.view
    best = speedup.optima(sims)
    ridge = speedup.ridge(device, report.dtype)
    facts = [f"Ridge of the latency model's roofline: {ridge:.0f} FLOP/byte (predicted)."]
    for step in FLAVORS:
        row = best[(best["simulation"] == "a") & (best["step"] == step)].iloc[0]
        facts.append(
            f"Batch 1, context 1024, {speedup.STEP_LABELS[step]}: {speedup.verdict(row).split(': ', 1)[1]} (predicted)."
        )
        rows = best[(best["simulation"] == "b") & (best["step"] == step)]
        lost = speedup.loses_from(rows, "batch")
        facts.append(
            f"Context 1024, {speedup.STEP_LABELS[step]}: "
            + (
                f"do not speculate from batch {lost} on (predicted)."
                if lost
                else f"speculation still pays at batch {rows['batch'].max()} (predicted)."
            )
        )
    facts.append(capacity_fact(planned))
    if len(validation):
        facts.append(
            f"Closed loop (measured): predicted speedups within {validation['error'].abs().max():.1%} "
            "of the measured ones over "
            f"tree sizes {', '.join(str(n) for n in validation['tree_size'])}."
        )
    return facts


def capacity_fact(planned: PlanResult | str) -> str:
    """perfmodel.plan's answer in one sentence, or why the model cannot be served."""
    row = planned.devices.iloc[0] if isinstance(planned, PlanResult) else {"fits": False, "note": planned}
    if not row["fits"]:
        return f"Capacity: {row['note']}"
    capacity = f"Capacity: max batch {row['max_batch']:,} ({row['kv_mb_per_seq']:,.0f} MB of KV cache per sequence); "
    if not row["meets_latency"]:
        return capacity + row["note"]
    tree_text = ("a tree of " + str(row["tree_size"])) if row["speculate"] else "no tree"
    return (
        capacity + f"recommended batch {row['batch']} with {tree_text}: "
        f"{row['per_token_ms']:.1f} ms/token, {row['total_tokens_s']:,.0f} tokens/s (predicted)."
    )


def acceptance_record_text(acceptance: ReportAcceptance) -> str:
    """What a decoder.measure record measured, in one paragraph."""
    record = acceptance.record
    return (
        f"Measured by python -m decoder.measure ({acceptance.record_path.name}): "
        f"{record.get('prompts')} held-out prompts x "
        f"{record.get('new_tokens_per_prompt')} tokens, {record['acceptance']['scheme']} acceptance, "
        f"batch {record.get('batch')}; "
        f"{record['mean_accepted_tokens']:.2f} tokens per step with its tree of {record['tree']['size']} tokens "
        f"(lossless: {record.get('lossless')}). Model: {Path(str(record.get('model'))).name}."
    )


def acceptance_error_text(acceptance: ReportAcceptance, table: pd.DataFrame) -> str:
    """The log fit's error against the measured tokens per step (`table`: tables.acceptance_errors)."""
    sizes = table["tree_size"].to_numpy()
    measured = table["measured_tokens_per_step"].to_numpy()
    return (
        "Acceptance: tokens per step per tree size, measured vs predicted. "
        f"Log fit: {fit_error(acceptance.choice.curve(sizes), measured)}. "
        f"The speedups use {acceptance.choice.label}."
    )


def ablation_text(ablation: pd.DataFrame, device_key: str) -> str:
    """The tree ablation in three sentences: the best trees, dense against sparse, the error."""
    best = {kind: rows.loc[rows["measured_speedup"].idxmax()] for kind, rows in ablation.groupby("kind")}
    said = [
        f"Fastest {kind} tree: {row['setting']} ({row['nodes']} candidates), {row['measured_acceptance']:.2f} "
        f"tokens per step and {row['measured_speedup']:.2f}x plain decoding (measured)."
        for kind, row in sorted(best.items(), reverse=True)
    ]
    versus = dense_against_sparse(ablation)
    if len(versus):
        said.append(
            f"At the same number of candidates, the {len(versus)} dense trees within the sparse trees' range accept "
            f"{-versus['acceptance_vs_sparse'].median():.0%} fewer tokens per step than the sparse curve "
            f"(median; {versus['speedup_vs_sparse'].median():+.0%} in speedup)."
        )
    device = ablation["device"].iloc[0]
    said.append(
        f"Prediction error over the {len(ablation)} trees, |predicted - measured| / measured: tokens per step at "
        f"most {ablation['acceptance_error'].abs().max():.1%}, speedup at most "
        f"{ablation['speedup_error'].abs().max():.1%}."
    )
    if device != device_key:
        said.append(
            f"Measured on {device}, not on this device: the tokens per step carry over (they are the model's), "
            "the speedups do not."
        )
    return " ".join(said)


def shown_path(path) -> str:
    """A path relative to the working folder where it is under it (no home folders in reports)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def input_items(report: Report, config: BuildConfig, validation: pd.DataFrame, ablation: pd.DataFrame) -> list[str]:
    """The device, model, measurements, acceptance, closed-loop runs, tree ablation and workload the page used."""
    m = report.model
    spec_text = "built from measured ceilings" if report.view.is_cpu else "hw_specs/" + report.view.spec.key + ".yaml"
    record_path = report.acceptance.record_path
    acceptance_text = shown_path(record_path) if record_path else "the paper preset"
    runs_text = ", ".join(sorted(set(validation["file"]))) if len(validation) else "none"
    return [
        f"Device: {report.view.spec.name} ({report.view.spec.key}), spec {spec_text}.",
        f"Model: {m.name}: hidden {m.hidden_size}, intermediate {m.intermediate_size}, {m.num_layers} layers, "
        f"{m.num_heads} query / {m.num_kv_heads} key-value heads, vocabulary {m.vocab_size}, "
        f"{m.medusa_heads} Medusa heads; dtype {report.dtype}.",
        f"Operator measurements: {measurement_note(report)}.",
        f"Acceptance: {acceptance_text}.",
        f"Closed-loop runs: {runs_text}.",
        f"Tree ablation: {', '.join(sorted(set(ablation['file']))) if len(ablation) else 'none'}.",
        f"Workload for capacity planning: prompts {config.prompt_len} tokens, responses {config.response_len} tokens"
        + (f", latency target {config.latency_ms:g} ms/token." if config.latency_ms else ", no latency target."),
    ]


def plain_step_text(report: Report) -> str:
    """The predicted plain decoding step of the whole model at batch 1, context 1024."""
    m = report.model
    latency = report.latency or view_latency(report.view, m, report.dtype)
    report_step = StepModel(m, latency, "full")
    return (
        "Predicted plain decoding step of the whole model at batch 1, context 1024: "
        f"{float(report_step.step_time(1, 1024, 1)) * 1e3:.2f} ms (latency: {latency.label})."
    )


def measurement_note(report: Report) -> str:
    """The operator measurement files, and whether any of them measured this model."""
    view = report.view
    if not view.sources:
        return "none"
    files = ", ".join(shown_path(p) for p in view.sources)
    models = view.models()
    if report.model.name in models:
        return files
    return (
        f"{files} (of {', '.join(models) or 'no model'}; "
        f"none of {report.model.name}, so its operators are predicted only)"
    )
