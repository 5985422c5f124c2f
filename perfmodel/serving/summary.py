"""A serving answer in words: the deployment to make first, then each device with and
without Medusa, then the schedule the answer runs and what the numbers rest on."""

from __future__ import annotations

import math

from perfmodel.measured.contract import plural
from perfmodel.planning.medusa_setting import MedusaSetting
from perfmodel.serving.capacity_answer import SPECULATOR, ServingAnswer, ServingOption


def ms(seconds: float) -> str:
    return (
        "n/a"
        if not math.isfinite(seconds)
        else f"{seconds * 1e3:,.0f} ms"
        if seconds >= 1
        else f"{seconds * 1e3:.1f} ms"
    )


def option_line(o: ServingOption, q: int, who: str = SPECULATOR) -> str:
    """One configuration: its devices, capacity and latencies, or why it has none; `who`
    speculates in its setting (the Medusa heads, or another drafter's chains)."""
    experts = f" (experts {o.experts})" if o.experts else ""
    head = f"{o.device} tp {o.tp}{experts}, {who} {o.medusa}: "
    if not o.fits:
        return head + o.note
    if not o.meets_targets:
        return head + f"{o.note} (unloaded: TTFT {ms(o.unloaded_ttft_s)}, TPOT {ms(o.unloaded_tpot_s)})"
    devices = "" if o.devices is None else f"{plural(o.devices, 'device')} ({plural(o.replicas, 'replica')}); "
    return head + (
        f"{devices}at most {o.max_rate:.3g} requests/s per replica ({o.max_tokens_s:,.0f} tokens/s); at "
        f"{o.load_rate:.3g} requests/s: p{q} TTFT {ms(getattr(o, f'ttft_p{q}_s'))}, p{q} TPOT "
        f"{ms(getattr(o, f'tpot_p{q}_s'))}, mean batch {o.mean_batch:.1f}"
        + ("" if o.medusa == MedusaSetting.OFF else f", trees in {o.tree_share:.0%} of steps")
    )


def medusa_verdict(answer: ServingAnswer, device: str) -> str | None:
    """Whether speculation (Medusa, or the answer's other drafter) pays on one device: the
    best option with it against the best without."""
    who = answer.speculator
    off = answer.among(device, "off").best
    with_medusa = [m for m in ("auto", "on") if any(o.device == device and o.medusa == m for o in answer.options)]
    if not with_medusa:
        return None
    on = answer.among(device, with_medusa[0]).best
    if off is None and on is None:
        return f"{device}: no configuration meets the targets, with or without {who}."
    if off is None or on is None:
        winner = on if off is None else off
        return f"{device}: only {who} {winner.medusa} meets the targets."
    if on.devices is not None and off.devices is not None:
        if on.devices < off.devices:
            return f"{device}: {who} pays: {on.devices} devices with it ({on.medusa}) against {off.devices} without."
        if on.devices > off.devices:
            return f"{device}: {who} does not pay: {on.devices} devices with it against {off.devices} without."
        return (
            f"{device}: {who} changes nothing in devices ({on.devices} either way); per replica "
            f"{on.max_tokens_s:,.0f} tokens/s with it, {off.max_tokens_s:,.0f} without."
        )
    better = "pays" if on.max_tokens_s / on.tp > off.max_tokens_s / off.tp else "does not pay"
    return (
        f"{device}: {who} {better}: {on.max_tokens_s / on.tp:,.0f} tokens/s per device with it, "
        f"{off.max_tokens_s / off.tp:,.0f} without."
    )


def schedule_lines(option: ServingOption) -> list[str]:
    """The bands of the schedule the option runs, one line per context band: batch -> tree or off."""
    schedule = option.schedule
    if schedule is None or option.medusa == MedusaSetting.OFF:
        return []
    lines = [f"Its speculation schedule ({option.device} tp {option.tp}; evidence: {schedule.evidence}):"]
    contexts = dict.fromkeys((b.context_min, b.context_max) for b in schedule.bands)
    for low, high in contexts:
        parts = [
            f"batch {b.batch_min}"
            + (f"-{b.batch_max}" if b.batch_max > b.batch_min else "")
            + ": "
            + (f"tree {b.tree_size} ({b.speedup:.2f}x)" if b.tree_size > 1 else "off")
            for b in schedule.bands
            if (b.context_min, b.context_max) == (low, high)
        ]
        lines.append(f"  context {low}-{high}: " + ", ".join(parts))
    return lines


def summary(answer: ServingAnswer) -> str:
    q = answer.targets.percentile
    rate = "" if answer.target_rate is None else f" (target {answer.target_rate:.3g} requests/s)"
    if answer.workload.startswith(f"{answer.target_rate:g} requests/s"):
        rate = ""  # the workload's own rate, already said
    lines = [
        f"Serving {answer.model}: {answer.workload}{rate}; targets: {answer.targets.describe()}. Predicted by "
        f"simulation ({answer.engine.prefill} prefill, at most {answer.engine.max_seqs} running sequences); "
        f"acceptance: {answer.acceptance}.",
    ]
    best = answer.best
    if best is None:
        lines.append("Answer: no configuration meets the targets; relax them or lower the rate.")
    else:
        lines.append("Answer: " + option_line(best, q, answer.speculator) + ".")
    devices = list(dict.fromkeys(o.device for o in answer.options))
    modes = list(dict.fromkeys(o.medusa for o in answer.options))
    lines.append(f"Best per device and {answer.speculator} setting:")
    for device in devices:
        for mode in modes:
            picked = answer.among(device, mode).best
            lines.append(
                "  " + option_line(picked, q, answer.speculator)
                if picked
                else f"  {device}, {answer.speculator} {mode}: meets no target"
            )
    verdicts = [medusa_verdict(answer, d) for d in devices]
    lines += [v for v in verdicts if v]
    with_medusa = [o for o in answer.options if o.medusa != MedusaSetting.OFF and o.meets_targets]
    shown = best if best is not None and best.medusa != MedusaSetting.OFF else None
    if shown is None and with_medusa:
        shown = max(with_medusa, key=lambda o: o.max_rate / o.tp)
    if shown is not None:
        lines += schedule_lines(shown)
    lines.append("Latency rests on (predicted):")
    for device in dict.fromkeys(o.device for o in answer.options):
        fitting = [o for o in answer.options if o.device == device and o.fits]
        if fitting:
            chosen = answer.among(device).best or fitting[0]
            lines.append(f"  {device} tp {chosen.tp}: {chosen.latency}")
    lines.append("Every configuration searched:")
    lines += ["  " + option_line(o, q, answer.speculator) for o in answer.options]
    return "\n".join(lines)
