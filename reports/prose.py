"""The report's sentences: what the numbers say, in words (the "At a glance" facts, the
introduction, the inputs and the notes built from the data)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pandas as pd

from hw_specs import SPEC_DIR
from perfmodel.acceptance.ablation import dense_against_sparse
from perfmodel.acceptance.rates import fit_error
from perfmodel.latency.choice import LatencyMode
from perfmodel.latency.step import StepFlavor
from perfmodel.planning import simulation_summary, simulations
from perfmodel.planning.capacity import PlanResult
from reports.report import BuildConfig, Report, latency_target_ms
from reports.sources import ReportAcceptance


def intro_text(report: Report, validation: pd.DataFrame) -> str:
    """When and how the page was written, and which measured data it uses."""
    measured = []
    if report.view.measured is not None and len(report.view.measured):
        measured.append(f"{len(report.view.measured)} operator timings")
    if report.view.ceilings:
        measured.append("empirical ceilings")
    if report.latency.mode in (LatencyMode.MEASURED, LatencyMode.CALIBRATED):
        measured.append(f"measured operator profiles ({report.latency.table.origin})")
    if report.latency.mode == LatencyMode.BORROWED:
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
    """The "At a glance" sentences. Measured speedups, where the page has them, come first,
    with why the predictions differ from them; then the ridge, whether to speculate per step
    model (each marked where the measurement disagrees), and capacity."""
    device = report.view
    best = simulations.optima(sims)
    ridge = simulation_summary.ridge(device, report.dtype)
    facts = closed_loop_facts(report, sims, validation)
    measured_pays = measured_pays_at(validation)
    facts.append(f"Ridge of the latency model's roofline: {ridge:.0f} FLOP/byte (predicted).")
    for step in dict.fromkeys(sims["step"]):  # every simulated step model, in the simulations' order
        row = best[(best["simulation"] == "a") & (best["step"] == step)].iloc[0]
        facts.append(
            f"Batch {row['batch']}, context {row['seq_len']}, {simulations.STEP_LABELS[step]}: "
            f"{simulations.verdict(row).split(': ', 1)[1]} "
            f"({predicted_against(measured_pays, {int(row['batch']): bool(row['speculate'])})})."
        )
        rows = best[(best["simulation"] == "b") & (best["step"] == step)]
        lost = simulations.loses_from(rows, "batch")
        pays = {int(b): lost is None or b < lost for b in measured_pays}
        facts.append(
            f"Context {rows['seq_len'].iloc[0]}, {simulations.STEP_LABELS[step]}: "
            + (
                f"do not speculate from batch {lost} on"
                if lost
                else f"speculation still pays at batch {rows['batch'].max()}"
            )
            + f" ({predicted_against(measured_pays, pays)})."
        )
    facts.append(capacity_fact(planned, measured_pays))
    return facts


def span(values, fmt: str = "{:.2f}", unit: str = "") -> str:
    """The range of `values` as 'lo-hi' (one value where they agree), in `fmt` with `unit`."""
    lo, hi = (fmt.format(v) for v in (min(values), max(values)))
    if lo == hi:
        return f"{lo}{unit}"
    return f"{lo}{unit} to {hi}{unit}" if any(text[0] in "+-" for text in (lo, hi)) else f"{lo}-{hi}{unit}"


def setting_text(rows: pd.DataFrame) -> str:
    batches = sorted({int(b) for b in rows["batch"]})
    contexts = sorted({int(c) for c in rows["context"]})
    return (
        f"batch{'es' if len(batches) > 1 else ''} {', '.join(map(str, batches))}, "
        f"context {', '.join(map(str, contexts))} tokens"
    )


def measured_pays_at(validation: pd.DataFrame) -> dict[int, bool]:
    """Per measured batch: whether some tree beat plain decoding in the closed loop."""
    if not len(validation):
        return {}
    return {int(b): bool((rows["measured_speedup"] > 1).any()) for b, rows in validation.groupby("batch")}


def predicted_against(measured_pays: dict[int, bool], predicted_pays: dict[int, bool]) -> str:
    """'predicted', and where the closed loop measured the opposite at a batch, says so."""
    disagree = [b for b, pays in predicted_pays.items() if b in measured_pays and measured_pays[b] != pays]
    if not disagree:
        return "predicted"
    said = [f"{'a tree paid' if measured_pays[b] else 'no tree paid'} at batch {b}" for b in sorted(disagree)]
    return f"predicted; the measurement above disagrees: {', '.join(said)}"


def closed_loop_facts(report: Report, sims: pd.DataFrame, validation: pd.DataFrame) -> list[str]:
    """What the closed loop measured, then why the page's predictions differ from it: their
    setting (context, batch), their latency source, and what each predicts at the measured
    setting, errors signed."""
    if not len(validation):
        return []
    measured = validation["measured_speedup"]
    fastest = validation.loc[measured.idxmax()]
    sizes = sorted({int(n) for n in validation["tree_size"]})
    outcome = (
        "no tree paid"
        if measured.max() <= 1
        else f"fastest: a tree of {fastest['tree_size']} tokens at {fastest['measured_speedup']:.2f}x"
    )
    facts = [
        f"Measured (closed loop, python -m perfmodel.validate, {setting_text(validation)}): trees of "
        f"{span(sizes, '{}')} tokens ran at {span(measured, unit='x')} plain decoding; {outcome}."
    ]
    step = report.step
    latency = step.shard.latency
    context = int(sims.loc[sims["simulation"] == "a", "seq_len"].iloc[0])  # the headline predictions' context

    def predicted_at(at_context: int | None) -> pd.Series:
        """The latency model's speedups for the measured trees and batches, at `at_context`
        (None: the context each was measured at)."""
        return pd.concat(
            [
                simulations.speedup_table(
                    step,
                    report.acceptance.choice.model,
                    batch,
                    at_context or measured_context,
                    sorted(set(rows.tree_size)),
                )["speedup"]
                for (batch, measured_context), rows in validation.groupby(["batch", "context"])
            ],
            ignore_index=True,
        )

    facts.append(
        f"Why the predictions below differ: they are for context {context} tokens (measured: "
        f"{span(validation['context'], '{}')}) and batches up to {int(sims['batch'].max())}, and they time steps "
        f"with {latency.label}. For the measured trees that model predicts {span(predicted_at(context), unit='x')} "
        f"at context {context} and {span(predicted_at(None), unit='x')} at the measured setting; the closed loop's "
        "own prediction (operators timed in the same run, plus plain decoding's host overhead) gave "
        f"{span(validation['predicted_speedup'], unit='x')}, an error of {span(validation['error'], '{:+.1%}')} "
        "((predicted - measured) / measured)."
    )
    return facts


def capacity_fact(planned: PlanResult | str, measured_pays: dict[int, bool] | None = None) -> str:
    """perfmodel.plan's answer in one sentence, or why the model cannot be served; a tree it
    recommends says where the closed loop measured that no tree paid (measured_pays), so the
    page does not state both without a word."""
    row = planned.devices.iloc[0] if isinstance(planned, PlanResult) else {"fits": False, "note": planned}
    if not row["fits"]:
        return f"Capacity: {row['note']}"
    tp = int(row.get("tensor_parallel", 1))
    replica = f" on {tp} devices in tensor parallel" if tp > 1 else ""
    capacity = (
        f"Capacity{replica}: max batch {row['max_batch']:,} ({row['kv_mb_per_seq']:,.0f} MB of KV cache per sequence); "
    )
    if not row["meets_latency"]:
        return capacity + row["note"]
    tree_text = ("a tree of " + str(row["tree_size"])) if row["speculate"] else "no tree"
    unpaid = sorted(b for b, pays in (measured_pays or {}).items() if not pays)
    if row["speculate"] and unpaid:
        batches = ", ".join(map(str, unpaid))
        said = (
            f"predicted; the measurement above found no tree paid at batch {batches}, and at batch {row['batch']} "
            "nothing was measured"
            if int(row["batch"]) not in unpaid
            else f"predicted; the measurement above disagrees: no tree paid at batch {row['batch']}"
        )
    else:
        said = "predicted"
    return (
        capacity + f"recommended batch {row['batch']} with {tree_text}: "
        f"{row['per_token_ms']:.1f} ms/token, {row['total_tokens_s']:,.0f} tokens/s ({said})."
    )


def acceptance_record_text(acceptance: ReportAcceptance) -> str:
    """What a decoder.measure record measured, in one paragraph."""
    record = acceptance.record
    return (
        f"Measured by python -m decoder.measure ({acceptance.record_path.name}): "
        f"{record.prompts} held-out prompts x "
        f"{record.new_tokens_per_prompt} tokens, {record.scheme} acceptance, "
        f"batch {record.batch}; "
        f"{record.mean_accepted_tokens:.2f} tokens per step with its tree of {record.tree_size} tokens "
        f"(lossless: {record.lossless}). Model: {Path(str(record.model)).name}."
    )


def acceptance_error_text(acceptance: ReportAcceptance, table: pd.DataFrame) -> str:
    """The log fit's error against the measured tokens per step (`table`: tables.acceptance_errors)."""
    sizes = table["tree_size"].to_numpy()
    measured = table["measured_tokens_per_step"].to_numpy()
    return (
        "Acceptance: tokens per step per tree size, measured vs predicted; "
        "error = (predicted - measured) / measured, signed. "
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
        f"Prediction error over the {len(ablation)} trees, (predicted - measured) / measured: tokens per step "
        f"{span(ablation['acceptance_error'], '{:+.1%}')}, speedup {span(ablation['speedup_error'], '{:+.1%}')}."
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


def spec_file_text(path: Path | None) -> str:
    """Where the device spec was read: hw_specs/<file> for a shipped one, wherever the
    package is installed; a --spec file by the path it was given (home shown as ~)."""
    if path is None:
        return "given in code (no file)"
    path = Path(path).resolve()
    if path.parent == Path(SPEC_DIR).resolve():
        return f"hw_specs/{path.name} (shipped)"
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        pass
    try:
        return str(Path("~") / path.relative_to(Path.home().resolve()))
    except (ValueError, RuntimeError):
        return str(path)


def input_items(report: Report, config: BuildConfig, validation: pd.DataFrame, ablation: pd.DataFrame) -> list[str]:
    """The device, model, measurements, acceptance, closed-loop runs, tree ablation and workload the page used."""
    m = report.model
    spec_text = "built from measured ceilings" if report.view.is_cpu else spec_file_text(report.view.spec.path)
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
        f"Workload for capacity planning: prompts {config.workload.workload.prompt} tokens, responses "
        f"{config.workload.workload.response} tokens"
        + (
            f", latency target {target:g} ms/token."
            if (target := latency_target_ms(config.workload))
            else ", no latency target."
        ),
    ]


def plain_step_text(report: Report) -> str:
    """The predicted plain decoding step of the whole model at batch 1, context 1024."""
    step = report.step
    traced = " (traced)" if report.flavor == StepFlavor.TRACED else ""
    return (
        f"Predicted plain decoding step of the whole model{traced} at batch 1, context 1024: "
        f"{float(step.step_time(1, 1024, 1)) * 1e3:.2f} ms (latency: {step.label})."
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
