"""The serving simulation against a real engine: each measured load run's own requests served
by the simulator at costs measured through the engine alone (perfmodel.serving.engine_costs:
its step sweep, never the load runs), under the engine's scheduling rules (chunked prefill
within its token budget per iteration, its cap on running sequences, its KV cache), set beside
what the engine did; and the comparison in words.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from perfmodel.base.engine_speculation import EngineSpeculation
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.engine_runs import EngineMeasurement
from perfmodel.planning.workload import Requests
from perfmodel.serving.engine_costs import PREFILL, EngineCosts, by_length, decode_rows, run_pricing
from perfmodel.serving.engine_drafting import DRAFTER_TWINS, DRAFTING, decoder_drafting
from perfmodel.serving.simulator import simulate, steady

QUANTILES = (50, 90)
LATENCY_TOLERANCE = 0.15  # the bar for TTFT and TPOT percentiles
THROUGHPUT_TOLERANCE = 0.10


def percentiles(served: pd.DataFrame) -> dict:
    """TTFT and TPOT percentiles over the steady-state window of requests in arrival order."""
    window = steady(served)
    return {
        f"{what}_p{q}_s": float(np.percentile(window[f"{what}_s"].dropna(), q))
        for what in ("ttft", "tpot")
        for q in QUANTILES
    }


def measured_summary(frame: pd.DataFrame) -> dict:
    return percentiles(frame.sort_values("request"))


def predicted_run(frame: pd.DataFrame, costs: EngineCosts, gain=None) -> tuple[pd.DataFrame, float]:
    """A measured run's requests simulated: per request (in request order) its times, TTFT from
    its arrival at the server, and the steady output tokens/s. `gain` (ordered frame -> each
    request's gain) where each request has its own tokens per step."""
    ordered = frame.sort_values("request")
    arrival = ordered["arrival_s"].to_numpy(float)
    requests = Requests(
        arrival + costs.entry_s,
        ordered["prompt"].to_numpy(),
        ordered["output"].to_numpy(),
        "the measured run",
        None if gain is None else gain(ordered),
    )
    run = simulate(requests, costs.costs, costs.engine)
    served = run.requests.assign(ttft_s=run.requests["first_token_s"] - arrival, request=ordered["request"].to_numpy())
    return served, run.tokens_s


def predicted_summary(frame: pd.DataFrame, costs: EngineCosts, gain=None) -> dict:
    served, tokens_s = predicted_run(frame, costs, gain)
    return {**percentiles(served), "tokens_s": tokens_s}


def compare_runs(measurement: EngineMeasurement) -> pd.DataFrame:
    """Per load run: measured and predicted p50/p90 TTFT and TPOT and output tokens/s, and the
    prediction's relative error in each."""
    pricing = run_pricing(measurement)
    rows = []
    runs = measurement.runs.set_index(["rate", "repeat"])
    for (rate, repeat), frame in measurement.requests.groupby(["rate", "repeat"], sort=True):
        if not frame["complete"].all():
            raise PerfkitError(f"the run at {rate:g}/s (repeat {repeat}) has failed requests; measure it again")
        measured = {**measured_summary(frame), "tokens_s": float(runs.loc[(rate, repeat), "tokens_s"])}
        predicted = predicted_summary(frame, *pricing[repeat])
        row = {"rate": rate, "repeat": repeat}
        for key in measured:
            row[f"measured_{key}"] = measured[key]
            row[f"predicted_{key}"] = predicted[key]
            row[f"error_{key}"] = predicted[key] / measured[key] - 1 if measured[key] else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def within(table: pd.DataFrame) -> dict[str, bool]:
    """Whether every run meets the issue's bars: latencies within 15%, tokens/s within 10%."""
    latency = [c for c in table.columns if c.startswith("error_t") and not c.endswith("tokens_s")]
    return {
        "latency": bool((table[latency].abs() <= LATENCY_TOLERANCE).all().all()),
        "throughput": bool((table["error_tokens_s"].abs() <= THROUGHPUT_TOLERANCE).all()),
    }


def cell(row: dict, key: str, scale: float, digits: int) -> str:
    """'measured / predicted (error)' of one quantity of a compared run."""
    measured, predicted = row[f"measured_{key}"], row[f"predicted_{key}"]
    error = predicted / measured - 1 if measured else math.nan
    return f"{measured * scale:.{digits}f} / {predicted * scale:.{digits}f} ({error:+.0%})"


def comparison_lines(table: pd.DataFrame, measurement: EngineMeasurement) -> list[str]:
    """The comparison in words: what was measured and how it was predicted, then per run the
    measured value, the prediction and its error, then whether the bars are met."""
    meta = measurement.meta
    engine, server, plan = meta["engine"], meta["server"], meta["plan"]
    machine = meta["machine"]
    lines = [
        f"{engine['name']} {engine['version']} serving {plan['model']} on {machine['name']} "
        f"({machine['logical_cpus']} CPUs), measured {meta['measured']}: max_num_seqs {server['max_num_seqs']}, "
        f"{server['max_num_batched_tokens']} tokens per iteration (chunked prefill), "
        f"KV cache {engine['kv_cache_tokens']:,} tokens, {server['dtype']}{speculating_words(measurement)}",
        f"measured: {len(table)} load runs of {plan['requests']} Poisson requests, prompts {plan['prompt_len']} "
        f"and outputs {plan['response_len']} tokens, greedy; percentiles over the middle 80% by arrival",
        *predicted_how(measurement),
        alone_line(measurement),
        "",
        f"{'rate/s':>6} {'run':>3}  {'TTFT p50 ms':>22}  {'TTFT p90 ms':>22}  {'TPOT p50 ms':>20}  "
        f"{'TPOT p90 ms':>20}  {'tokens/s':>22}",
        f"{'':>6} {'':>3}  {'measured / predicted':>22}  {'':>22}  {'':>20}  {'':>20}  {'':>22}",
    ]
    for row in table.itertuples(index=False):
        r = row._asdict()
        lines.append(
            f"{row.rate:>6g} {row.repeat:>3}  {cell(r, 'ttft_p50_s', 1e3, 1):>22}  "
            f"{cell(r, 'ttft_p90_s', 1e3, 1):>22}  {cell(r, 'tpot_p50_s', 1e3, 2):>20}  "
            f"{cell(r, 'tpot_p90_s', 1e3, 2):>20}  {cell(r, 'tokens_s', 1, 0):>22}"
        )
    met = within(table)
    lines += [
        "",
        f"TTFT and TPOT within {LATENCY_TOLERANCE:.0%} in every run: {'yes' if met['latency'] else 'no'}; "
        f"tokens/s within {THROUGHPUT_TOLERANCE:.0%}: {'yes' if met['throughput'] else 'no'}",
    ]
    return [line.rstrip() for line in lines]


def alone_line(measurement: EngineMeasurement) -> str:
    """A request of the plan's lengths that finds the engine idle: its first token as the sweep's
    lone probe measured it, then as predicted (perfmodel.serving.engine_costs: never faster)."""
    plan, steps = measurement.meta["plan"], measurement.steps
    prompt, output = int(plan["prompt_len"]), int(plan["response_len"])
    lone = by_length(steps[steps["kind"] == PREFILL])
    measured = float(np.interp(prompt, lone.index, lone))
    probe = "its lone probe" if prompt in lone.index else "between its lone probes"
    pricing = run_pricing(measurement)
    alone = pd.DataFrame({"request": [0], "arrival_s": [0.0], "prompt": [prompt], "output": [output]})
    predicted = float(predicted_run(alone, pricing[min(pricing)][0])[0]["ttft_s"].iloc[0])
    return (
        f"alone on the engine, a {prompt}-token prompt's first token: {measured * 1e3:.1f} ms measured ({probe} in "
        f"the sweep), {predicted * 1e3:.1f} ms predicted"
    )


def speculating_words(measurement: EngineMeasurement) -> str:
    speculating = measurement.speculating
    return "" if speculating is EngineSpeculation.OFF else f"; its own {speculating} speculation"


def predicted_how(measurement: EngineMeasurement) -> list[str]:
    sweep = f"the engine's step sweep ({len(measurement.steps)} points, never the load runs)"
    if measurement.speculating is EngineSpeculation.OFF:
        return [f"predicted: the serving simulation at {sweep}, each run's own arrivals"]
    per_step = ", ".join(
        f"{d.tokens_per_step:.3f} (run {repeat})" for repeat, d in sorted(decoder_drafting(measurement).items())
    )
    chunked = decode_rows(measurement.steps)["iteration_s"].notna().all()
    step = (
        "the sweep's gap between streamed chunks (one an iteration)"
        if chunked
        else "the sweep's per-token gap times that point's tokens per step (/metrics)"
    )
    gains = (
        "each request decodes in the steps the project's decoder drafted it in on its own prompt"
        if measurement.decoder_requests is not None
        else "each sequence gains the tokens per step the project's decoder drafted on the run's prompts"
    )
    return [
        f"predicted: the serving simulation at {sweep}, each run's own arrivals; a decoding step's time is {step}, "
        f"and {gains} (tokens per step over the run's prompts: {per_step})",
    ]


def not_predicted(measurement: EngineMeasurement) -> str:
    """Why a speculating measurement cannot be predicted ("" where it can): its prediction
    needs Medusa heads, the decoder's acceptance on its prompts and the sweep's drafts."""
    if measurement.speculating not in DRAFTER_TWINS:
        return "the project has no model of its acceptance"
    if measurement.decoder_speculation is None:
        command = f"python -m profilers.engine acceptance --out {measurement.folder}"
        return f"no decoder acceptance on its prompts yet: {command}"
    drafts = decode_rows(measurement.steps)["drafts"]
    return "" if bool((drafts > 0).all()) else "its step sweep counted no drafts (measured before the sweep did)"


def shares(drafts: int, accepted_per_position: str) -> str:
    """Per draft position, the share of drafts whose token there was accepted."""
    if not drafts:
        return "no drafts"
    return ", ".join(f"{a / drafts:.1%}" for a in json.loads(accepted_per_position))


def speculation_lines(measurement: EngineMeasurement) -> list[str]:
    """A speculating engine's runs where they cannot be predicted (n-gram drafting, or a folder
    without the decoder's acceptance or the sweep's drafts), measured only: latencies,
    tokens/s, and per draft position the share of drafts whose token there was accepted."""
    meta, plan = measurement.meta, measurement.meta["plan"]
    lines = [
        f"{meta['engine']['name']} {meta['engine']['version']} serving {plan['model']} with its own "
        f"{measurement.speculating} speculation, measured {meta['measured']} (not predicted: "
        f"{not_predicted(measurement)})",
        f"{len(measurement.runs)} load runs of {plan['requests']} Poisson requests, prompts {plan['prompt_len']} "
        f"(random token ids) and outputs {plan['response_len']} tokens, greedy",
        "",
        f"{'rate/s':>6} {'run':>3}  {'TTFT p50/p90 ms':>16}  {'TPOT p50/p90 ms':>16}  {'tokens/s':>9}  "
        "accepted at draft position 1, 2, ... (share of drafts)",
    ]
    speculation = measurement.speculation.set_index(["rate", "repeat"])
    runs = measurement.runs.set_index(["rate", "repeat"])
    for (rate, repeat), frame in measurement.requests.groupby(["rate", "repeat"], sort=True):
        got = measured_summary(frame)
        drafts = int(speculation.loc[(rate, repeat), "drafts"])
        tokens_s = runs.loc[(rate, repeat), "tokens_s"]
        lines.append(
            f"{rate:>6g} {repeat:>3}  {got['ttft_p50_s'] * 1e3:>7.1f}/{got['ttft_p90_s'] * 1e3:<8.1f}  "
            f"{got['tpot_p50_s'] * 1e3:>7.2f}/{got['tpot_p90_s'] * 1e3:<8.2f}  {tokens_s:>9,.0f}  "
            f"{shares(drafts, speculation.loc[(rate, repeat), 'accepted_per_position'])} of {drafts:,} drafts"
        )
    return [line.rstrip() for line in lines + acceptance_lines(measurement)]


def acceptance_lines(measurement: EngineMeasurement) -> list[str]:
    """Per run's prompts, the share of drafts accepted at each position: the engine's, and the
    project's decoder drafting the same way on the same prompts (where it ran)."""
    twin = measurement.decoder_speculation
    if twin is None:
        return []
    engine = measurement.speculation.drop_duplicates("repeat").set_index("repeat")
    lines = [
        "",
        "accepted at draft position 1, 2, ...: the engine's (/metrics), and the project's decoder drafting as the "
        f"engine does ({DRAFTING[measurement.speculating]}), greedy, on the run's prompts "
        "(profilers.engine acceptance)",
    ]
    for row in twin.sort_values("repeat").itertuples(index=False):
        theirs = engine.loc[row.repeat]
        lines.append(
            f"  run {row.repeat}: engine {shares(int(theirs['drafts']), theirs['accepted_per_position'])} of "
            f"{int(theirs['drafts']):,} drafts; decoder {shares(row.drafts, row.accepted_per_position)} of "
            f"{row.drafts:,}"
        )
    return lines


def measurement_lines(measurement: EngineMeasurement) -> list[str]:
    """What validate --engine and profilers.engine check print for a measurement folder."""
    if measurement.speculating is EngineSpeculation.OFF:
        return comparison_lines(compare_runs(measurement), measurement)
    if not not_predicted(measurement):
        return comparison_lines(compare_runs(measurement), measurement) + acceptance_lines(measurement)
    return speculation_lines(measurement)
