"""The answer in words: what the workload is, which tree to run and why, what was measured,
which deployment serves the rate, and what every number on the page rests on (its latency
stack and launch regime).
"""

from __future__ import annotations

import pandas as pd

from perfmodel.cli.workload_options import WorkloadSettings
from perfmodel.planning.medusa_setting import MedusaSetting
from perfmodel.serving.capacity_answer import ServingAnswer, ServingOption
from perfmodel.serving.summary import option_line
from reports.answer import PageAnswer, band_labels, evidence, max_batch
from reports.prose import capacity_fact, measured_pays_at, shown_path

# ----------------------------------------------------------------------------- words


def served_text(workload) -> str:
    """The requests served: a trace by its path as the page shows paths (no home folders)."""
    if workload.trace is None:
        return workload.describe()
    rate = f" at {workload.rate:g} requests/s" if workload.rate else ""
    return f"trace {shown_path(workload.trace)}{rate}"


def workload_text(settings: WorkloadSettings, context: int) -> str:
    """The workload the answer answers, as the user gave it."""
    workload, targets = settings.workload, settings.targets
    said = [f"prompts {workload.prompt} tokens, responses {workload.response} tokens"]
    if settings.simulated:
        said = [served_text(workload), f"targets: {targets.describe()}", f"{settings.engine.prefill} prefill"]
        if workload.trace is not None:  # its lengths are the trace's: the capacity plan's are still these
            said.append(f"capacity plan for prompts {workload.prompt}, responses {workload.response} tokens")
    said[0] += f" (average decoding context {context} tokens)"
    if targets.latency_s is not None:
        said.append(f"at most {targets.latency_s * 1e3:g} ms per token")
    return f"Workload: {'; '.join(said)}; Medusa {settings.medusa}."


def tree_sentence(answer: PageAnswer) -> str:
    """The tree to run at the workload's batch and context: the measured best where a closed
    loop measured that cell, else the decision map's (predicted)."""
    batch, whence = answer.batch
    row, column = answer.here
    cell = answer.cells()[row][column]
    at = f"at batch {batch} ({whence}) and context {answer.context}"
    best = None if answer.serving is None else answer.serving.best
    if best is not None and best.medusa == MedusaSetting.OFF and cell.tree_size > 1:
        return (
            "Recommended: Medusa off: the serving simulation below ranks it first (the fewest devices for the rate, "
            f"then the most tokens/s per device). {at.capitalize()} the map's fastest step would be a tree of "
            f"{cell.tree_size} tokens at {cell.speedup:.2f}x plain decoding ({evidence(cell.evidence).words})."
        )
    if cell.measured:
        what = f"a tree of {cell.tree_size} tokens" if cell.tree_size > 1 else "no tree (plain decoding)"
        return (
            f"Recommended {at}: {what}, measured: the closed loop's fastest tree there ran at {cell.speedup:.2f}x "
            "plain decoding."
        )
    said = evidence(cell.evidence).words
    if cell.tree_size > 1:
        return f"Recommended {at}: a tree of {cell.tree_size} tokens, {cell.speedup:.2f}x plain decoding ({said})."
    return f"Recommended {at}: no tree; plain decoding is the fastest there ({said})."


def measured_sentence(answer: PageAnswer) -> str | None:
    """What the closed loop measured in the map, said before any prediction; None where it
    measured nothing, or only the workload's cell (the tree sentence then says it)."""
    if not answer.measured or set(answer.measured) == {answer.here}:
        return None
    batches = band_labels(answer.schedule.batch_grid, max_batch(answer.planned))
    contexts = band_labels(answer.schedule.context_grid)
    said = [
        f"batch {batches[i]}, context {contexts[j]}: "
        + (
            f"the fastest tree, {c.tree_size} tokens, ran at {c.speedup:.2f}x plain decoding"
            if c.tree_size > 1
            else "no tree paid"
        )
        for (i, j), c in sorted(answer.measured.items())
    ]
    return f"Measured (closed loop, python -m perfmodel.validate; the M cells below): {'; '.join(said)}."


def serving_sentence(serving: ServingAnswer) -> str:
    """The serving simulation's answer in one sentence: the devices the rate needs, the
    latencies at the target percentile, the tokens/s, with or without Medusa."""
    q = serving.targets.percentile
    rate = "" if serving.target_rate is None else f" at {serving.target_rate:.3g} requests/s"
    head = f"Capacity{rate} (predicted by simulating the engine, {serving.engine.prefill} prefill): "
    best = serving.best
    if best is not None:
        return head + option_line(best, q) + "."
    return head + f"no configuration meets {serving.targets.describe()}; " + option_line(closest(serving), q) + "."


def chosen_degree(serving: ServingAnswer | None) -> int | None:
    """The tensor-parallel degree the serving answer deploys (or comes nearest with), None
    without one or where nothing fits."""
    if serving is None:
        return None
    option = serving.best or closest(serving)
    return option.tp if option.fits else None


def closest(serving: ServingAnswer) -> ServingOption:
    """The configuration nearest to meeting the targets: the one that serves most, else the first."""
    return max(serving.options, key=lambda o: (o.fits, o.max_rate))


def capacity_sentence(answer: PageAnswer, validation: pd.DataFrame) -> str:
    if answer.serving is not None:
        return serving_sentence(answer.serving)
    return capacity_fact(answer.planned, measured_pays_at(validation))


def stack_text(latency) -> str:
    """Whose measurements time the operators (perfmodel.latency.gemm_grid's stacks)."""
    stack = getattr(latency, "stack", None)
    return stack if stack else "none named (a roofline: no engine's or harness's operator timings)"


def regime_text(latency) -> str:
    """Which launch regime (perfmodel.base.launch) the page's step times assume."""
    if getattr(latency.spec, "kernel_launch_us", None) is None:
        return "this CPU's, kernels run one after another on the host's own thread, its measured per-op overhead each"
    return (
        "kernels back to back, as an engine's CUDA-graph step runs them (graph); the reference decoder's eager step, "
        "bound by its host on a GPU, is slower: python -m perfmodel.speedup --step traced --launch eager prices it"
    )


def rests_on(report, answer: PageAnswer, validation: pd.DataFrame) -> list[str]:
    """What the numbers rest on, measured before predicted."""
    acceptance = report.acceptance
    record = (
        f"measured by python -m decoder.measure ({acceptance.record_path.name})"
        if acceptance.measured
        else "not measured for this model"
    )
    measured = (
        f"measured in {len(answer.measured)} cell(s) (M) by the closed loop, python -m perfmodel.validate "
        f"({len(validation)} runs of the reference decoder); predicted in the others"
        if answer.measured
        else "predicted in every cell: no closed loop measured this device and model"
    )
    return [
        f"Decision map: {measured}.",
        f"Step times: {report.step.label} ({evidence(answer.schedule.evidence.split('/')[0]).words}).",
        f"Acceptance: {acceptance.choice.label}, {record}.",
        f"Software stack of the step times: {stack_text(report.latency)}.",
        f"Launch regime of the step times: {regime_text(report.latency)}.",
    ]
