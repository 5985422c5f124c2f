"""Issue #56, item 7: the serving simulation against vLLM's CPU build predicted a time to first
token below the engine's own lone-prefill probe (prompts of 512 tokens at 4 sequences and a
few requests a second: the sweep's lone prefill 49-59 ms, the simulation 44-48 ms). An
iteration that decoded nothing was priced at mixed(L) alone, the increment a prefill adds to
a decoding step, so the iteration's own cost (which a decoding step's time carries) was
missing whenever the engine was idle. Each test here fails on the code before the fix, or
checks the mixes measured for it (prefill-heavy, decode-heavy, mixed). No test starts the
engine: tests/test_engine.py has its end-to-end test."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.base.engine_speculation import EngineSpeculation
from perfmodel.measured.engine_runs import ENGINE_FOLDER, read_engine_measurement, shipped
from perfmodel.planning.workload import Requests
from perfmodel.serving.costs import ServingCosts, context_grid
from perfmodel.serving.engine_check import compare_runs, measurement_lines, not_predicted, predicted_run
from perfmodel.serving.engine_costs import run_pricing
from perfmodel.serving.simulator import EngineConfig, simulate
from reports.commands.validate import main as validate_main

# The mixes measured for the item (2-core AMD EPYC): prefill-heavy (the issue's own, measured
# twice), decode-heavy and mixed, each at its own cap on running sequences: (prompt, output,
# max_num_seqs).
NEW = {
    f"cpu-amd-epyc-2c/{ENGINE_FOLDER}/bundled-seqs4-p512-o32": (512, 32, 4),
    f"cpu-amd-epyc-2c/{ENGINE_FOLDER}/bundled-seqs4-p512-o32-rerun": (512, 32, 4),
    f"cpu-amd-epyc-2c/{ENGINE_FOLDER}/bundled-seqs8-p64-o256": (64, 256, 8),
    f"cpu-amd-epyc-2c/{ENGINE_FOLDER}/bundled-seqs6-p256-o128": (256, 128, 6),
}
# Every shipped folder the simulation predicts (n-gram drafting has no model of its acceptance).
PREDICTED = [
    name
    for name in shipped()
    if read_engine_measurement(name).speculating is EngineSpeculation.OFF
    or not not_predicted(read_engine_measurement(name))
]


def lone_probe(measurement) -> pd.Series:
    """What the sweep measured for a prompt alone on the engine: the median time to first
    token of its lone one-token requests (kind prefill), by prompt length."""
    steps = measurement.steps
    return steps[steps["kind"] == "prefill"].groupby("tokens")["step_s"].median()


def first_pricing(measurement):
    """The costs (and per-request gains) the folder's first run's prompts are priced at."""
    pricing = run_pricing(measurement)
    return pricing[min(pricing)]


def test_every_predicted_folder_is_checked_and_the_new_mixes_are_shipped():
    assert set(NEW) <= set(PREDICTED)
    assert f"cpu-intel-xeon-processor-2c/{ENGINE_FOLDER}/bundled-seqs8" in PREDICTED


@pytest.mark.parametrize("folder", PREDICTED)
def test_a_request_alone_is_predicted_no_faster_than_the_sweeps_lone_probe_of_its_prompt(folder):
    measurement = read_engine_measurement(folder)
    costs, _ = first_pricing(measurement)
    lone = lone_probe(measurement)
    lone = lone[lone.index <= measurement.meta["server"]["max_model_len"]]
    output = int(measurement.meta["plan"]["response_len"])
    # each request alone: the previous one long finished when it arrives
    alone = pd.DataFrame(
        {"request": range(len(lone)), "arrival_s": 30.0 * np.arange(len(lone)), "prompt": lone.index, "output": output}
    )
    served, _ = predicted_run(alone, costs)
    predicted = served["ttft_s"].to_numpy()
    short = {int(n): (p * 1e3, m * 1e3) for n, p, m in zip(lone.index, predicted, lone) if p < m - 1e-12}
    assert not short, f"{folder}: predicted below the lone probe (prompt: predicted ms, probe ms): {short}"
    # the sweep's own measurement of that work, not more: the iteration's cost is not counted twice
    assert predicted[lone.index >= 16] == pytest.approx(lone[lone.index >= 16].to_numpy(), rel=0.2)


def idle_at_entry(served: pd.DataFrame) -> np.ndarray:
    """Per simulated request, whether no other was in the engine when it entered."""
    entry, finish = served["arrival_s"].to_numpy(), served["finish_s"].to_numpy()
    inside = (entry[None, :] <= entry[:, None]) & (finish[None, :] > entry[:, None])
    np.fill_diagonal(inside, False)
    return ~inside.any(axis=1)


@pytest.mark.parametrize("folder", PREDICTED)
def test_every_request_reaching_an_idle_engine_in_a_load_run_is_predicted_no_faster_than_alone(folder):
    measurement = read_engine_measurement(folder)
    pricing = run_pricing(measurement)
    lone = lone_probe(measurement)
    checked = 0
    for (rate, repeat), frame in measurement.requests.groupby(["rate", "repeat"]):
        costs, gain = pricing[repeat]
        served, _ = predicted_run(frame, costs, gain)
        idle = idle_at_entry(served)
        floor = np.interp(served["prompt"].to_numpy(), lone.index.to_numpy(), lone.to_numpy())
        ttft = served["ttft_s"].to_numpy()
        assert (ttft[idle] >= floor[idle] - 1e-12).all(), f"{folder} at {rate:g}/s, run {repeat}"
        checked += int(idle.sum())
    assert checked > 0


def test_the_issues_mix_at_light_load_is_predicted_no_faster_than_its_lone_prefill():
    # 512-token prompts, 32 outputs, 4 sequences, 2 requests a second: mostly alone on the engine
    # (the first measurement, where the simulation said 43.6 ms against a probe of 50.7 ms)
    folder = next(iter(NEW))
    measurement = read_engine_measurement(folder)
    table = compare_runs(measurement)
    light = table[table["rate"] == table["rate"].min()]
    floor = float(lone_probe(measurement)[512])
    assert len(light) == 2 and (light["predicted_ttft_p50_s"] >= floor - 1e-12).all()


@pytest.mark.parametrize("folder", list(NEW))
def test_the_new_mixes_load_and_are_shown_measured_first(folder, capsys):
    measurement = read_engine_measurement(folder)
    plan, server = measurement.meta["plan"], measurement.meta["server"]
    assert (plan["prompt_len"], plan["response_len"], server["max_num_seqs"]) == NEW[folder]
    assert measurement.speculating is EngineSpeculation.OFF and set(measurement.steps["pass"]) == {0, 1}
    assert measurement.requests["complete"].all() and (measurement.runs["failed"] == 0).all()
    assert (measurement.runs.groupby("rate").size() == 2).all() and measurement.runs["rate"].nunique() >= 3
    lines = measurement_lines(measurement)
    assert lines[1].startswith("measured:") and lines[2].startswith("predicted:")
    alone = lines[3]  # the floor in words: the lone probe measured, then the prediction
    assert alone.startswith(f"alone on the engine, a {NEW[folder][0]}-token prompt's first token: ")
    assert alone.index("ms measured") < alone.index("ms predicted")
    assert validate_main(["--engine", "vllm", "--engine-data", folder]) == 0
    printed = capsys.readouterr().out
    assert f"prompts {NEW[folder][0]} and outputs {NEW[folder][1]} tokens" in printed
    assert "measured / predicted" in printed
    table = compare_runs(measurement)
    assert (table["error_tokens_s"].abs() <= 0.10).all()  # the throughput bar, met by every mix


def tiny_costs(idle_s: float | None) -> ServingCosts:
    """A step of 2 ms at any batch and context, prefill at 0.1 ms a token, and an idle
    iteration's own cost of `idle_s` (None: none)."""
    contexts = context_grid(64)
    shape = (2, len(contexts))
    lengths = np.arange(1, 65)
    idle = None if idle_s is None else np.full(len(lengths), idle_s)
    return ServingCosts(
        contexts, np.full(shape, 2e-3), np.ones(shape), np.ones(shape, dtype=int), lengths, 1e-4 * lengths, 10**6, 0,
        "tiny", idle,
    )  # fmt: skip


@pytest.mark.parametrize("prefill, second_s", [("chunked", 1.5e-3 + 2e-3 + 1e-3), ("separate", 1.5e-3 + 1e-3 + 5e-3)])
def test_only_an_iteration_that_decodes_nothing_pays_its_own_cost(prefill, second_s):
    # The first request finds the engine idle: its prefill (1 ms) and the idle iteration's own
    # cost (5 ms). The second arrives 0.5 ms into the first's first decoding step and waits
    # 1.5 ms for it; chunked, its prefill then rides on the next decoding step (2 ms + 1 ms,
    # nothing more); separate, its prefill is an iteration of its own, decoding nothing.
    requests = Requests(np.array([0.0, 0.0065]), np.array([10, 10]), np.array([5, 5]), "two")
    run = simulate(requests, tiny_costs(5e-3), EngineConfig(prefill))
    assert run.ttft_s.tolist() == pytest.approx([1e-3 + 5e-3, second_s])
    assert simulate(requests, tiny_costs(None), EngineConfig(prefill)).ttft_s[0] == pytest.approx(1e-3)
