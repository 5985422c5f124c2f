"""Issue 57: a static step's warm-up (a CUDA graph's capture, a compilation, an eager step
undone) happens before decoding is timed and is recorded apart (decoder.static_step), the
twin carries it as its own column, and the shipped graph runs, which timed their capture
inside their steps, have it inferred and taken out (profilers.closed_loop.capture)."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
import torch
from torch._dynamo.utils import counters

from decoder.acceptance import AcceptanceConfig
from decoder.static_step import Execution, StaticStep
from decoder.tree import Drafting, tree_buffers
from perfmodel.acceptance.reference_trees import VICUNA_7B_TREE
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.cli import run
from perfmodel.models.operators import HEAD_TOP_K
from profilers.campaign_variants import TWIN_RECORD
from profilers.closed_loop import capture, regimes
from profilers.closed_loop.twin import TwinConfig, twin_loop
from profilers.closed_loop.twin_print import print_twin_batch
from tests.distilled import PROMPTS

H100_GRAPH = regimes.MEASUREMENTS_DIR / "h100-sxm/gpu-check-2026-11-28/twin/llama-2-7b-fp16-graph.csv"
H200_GRAPHS = sorted(regimes.MEASUREMENTS_DIR.glob("h200/gpu-check-2026-11-2*/twin/llama-2-7b-fp16-graph.csv"))


def counting_steps(monkeypatch) -> list[str]:
    """Record, per call of the step's body, whether it ran in a warm-up or a timed step."""
    seen, phase = [], ["timed"]
    body, warm_up = StaticStep._step, StaticStep.warm_up

    def step(self):
        seen.append(phase[0])
        body(self)

    def warming(self):
        phase[0] = "warm-up"
        warm_up(self)
        phase[0] = "timed"

    monkeypatch.setattr(StaticStep, "_step", step)
    monkeypatch.setattr(StaticStep, "warm_up", warming)
    return seen


def test_the_static_step_warms_up_before_the_timer_and_undoes_it(decoder, monkeypatch):
    eager = decoder.generate(PROMPTS[:2], 16, drafting=Drafting(VICUNA_7B_TREE))
    seen = counting_steps(monkeypatch)
    static = decoder.generate(PROMPTS[:2], 16, drafting=Drafting(VICUNA_7B_TREE), launch="static")
    assert seen == ["warm-up"] + ["timed"] * static.steps  # one step before the timer, none inside it
    assert static.warmup_s > 0 and static.decode_s > 0
    assert static.tokens == eager.tokens and static.path_lengths == eager.path_lengths  # the warm-up left no trace


def test_the_compiled_step_compiles_in_its_warm_up_and_a_second_call_reuses_it(decoder, monkeypatch):
    prompts = PROMPTS[2:4]
    plain = decoder.generate(prompts, 12)
    calls = []
    step_call = StaticStep.__call__

    def timed_step(self):  # no compilation inside a timed step
        compiled = counters["stats"]["unique_graphs"]
        step_call(self)
        calls.append(counters["stats"]["unique_graphs"] - compiled)

    monkeypatch.setattr(StaticStep, "__call__", timed_step)
    # dynamo's own backend: the same compilation, when it happens, without a minute of codegen
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    monkeypatch.setattr(decoder, "_static_steps", {})  # the session's decoder keeps no step of this test
    before = counters["stats"]["unique_graphs"]
    first = decoder.generate(prompts, 12, drafting=Drafting(VICUNA_7B_TREE), launch="compiled")
    assert counters["stats"]["unique_graphs"] > before and set(calls) == {0}  # compiled in the warm-up
    assert first.warmup_s > 0 and first.tokens == plain.tokens
    kept = dict(decoder._static_steps)
    second = decoder.generate(prompts, 12, drafting=Drafting(VICUNA_7B_TREE), launch="compiled")
    assert decoder._static_steps == kept  # the same step, at the same shape
    assert second.warmup_s == 0.0 and second.tokens == plain.tokens


def test_warm_up_steps_are_undone_whatever_they_drew(decoder):
    # the code every regime's warm-up runs through, the graph's capture too (it needs CUDA)
    buffers = tree_buffers(VICUNA_7B_TREE, len(decoder.heads), HEAD_TOP_K, "cpu")
    sampling = AcceptanceConfig("rejection", 1.0)
    generator = torch.Generator().manual_seed(3)
    step = StaticStep(decoder, buffers, 2, 96, sampling, Drafting(), Execution(Launch.STATIC), generator)
    with torch.inference_mode():
        step.start(decoder, PROMPTS[:2])
        before, rng = step.buffers.snapshot(), step.generator.get_state()
        step.undone(2)
    after = step.buffers.snapshot()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert torch.equal(rng, step.generator.get_state())


def test_a_graph_step_off_cuda_is_refused_when_it_is_built(decoder):
    buffers = tree_buffers(VICUNA_7B_TREE, len(decoder.heads), HEAD_TOP_K, "cpu")
    with pytest.raises(PerfkitError, match="captures a CUDA graph: it needs a CUDA device, not 'cpu'"):
        StaticStep(decoder, buffers, 1, 64, AcceptanceConfig(), Drafting(), Execution(Launch.GRAPH), torch.Generator())


def test_the_twins_table_has_the_warm_up_apart_from_the_step_time(capsys):
    config = TwinConfig(
        model="bundled",
        replay=TWIN_RECORD,
        sizes=(4,),
        dtype="fp32",
        prompts=1,
        prompt_len=16,
        new_tokens=8,
        rounds=1,
        budget_s=0.01,
        launch="static",
        profile=False,
    )
    table, classes, summary = twin_loop(config, log=lambda text: None)
    # the untimed warm-up run and the timed one each warmed up a static step: one step each
    assert (table["warmup_s"] > 0).all()
    print_twin_batch(table, classes, summary)
    out = capsys.readouterr().out
    assert "warm-up ms" in out and "excluded from its step time" in out


def test_the_h100_graph_runs_capture_is_inferred_from_its_own_steps():
    steps = pd.read_csv(H100_GRAPH)
    fit = capture.capture_fit(steps, Launch.GRAPH)
    assert fit.slope == pytest.approx(1.00, abs=0.01)
    assert fit.capture_s == pytest.approx(0.124, abs=0.002)
    assert fit.excess_s == pytest.approx((0.095, 0.171), abs=0.001)
    net = capture.without_capture(steps, Launch.GRAPH)
    assert (net["capture"] == capture.INFERRED).all()
    assert capture.twin_error(net) == pytest.approx(0.027, abs=0.002)  # the twin's price holds once it is out
    h200 = [capture.capture_fit(pd.read_csv(p), Launch.GRAPH).capture_s for p in H200_GRAPHS]
    assert np.round(h200, 3).tolist() == [0.189, 0.185]


def test_a_recorded_warm_up_is_used_and_an_eager_run_holds_none():
    steps = pd.read_csv(H100_GRAPH).assign(warmup_s=0.05)
    recorded = capture.without_capture(steps, Launch.GRAPH)
    assert (recorded["capture"] == capture.RECORDED).all() and (recorded["capture_s"] == 0.05).all()
    assert recorded["net_step_s"].equals(steps["measured_step_s"])  # never in the steps: nothing taken out
    eager = capture.without_capture(steps.drop(columns="warmup_s"), Launch.EAGER)
    assert (eager["capture"] == capture.NONE).all() and eager["net_step_s"].equals(steps["measured_step_s"])
    calibrated = steps.drop(columns="warmup_s").assign(pricing="in-step factor")
    assert (capture.without_capture(calibrated, Launch.GRAPH)["capture"] == capture.UNKNOWN).all()


def test_the_regimes_command_shows_the_capture_apart_and_the_error_without_it(capsys):
    assert run(regimes.main, ["--gpu", "h100", str(H100_GRAPH)]) == 0
    out = capsys.readouterr().out
    assert "capture ms" in out and "error w/o capture" in out
    line = next(text for text in out.splitlines() if text.startswith("capture of gpu-check-2026-11-28 graph"))
    assert "inferred from the fit, not recorded" in line and "+ 124 ms" in line and "95-171 ms" in line
    assert "the twin's price is off by a median 2.7%" in line
    summary = next(text for text in out.splitlines() if text.startswith("graph: 9 steps"))
    raw, net = (float(part.split("median |error| ")[1].split("%")[0]) for part in summary.split("with the capture out"))
    assert net < raw / 2  # the capture was most of the graph step's error


def test_a_run_is_priced_with_the_forward_it_ran():
    import pandas as pd

    from profilers.closed_loop.regimes import run_fused

    shipped = pd.DataFrame({"launch": ["graph"], "batch": [1]})  # from before the fused step: no column
    assert not run_fused(shipped)
    assert run_fused(shipped.assign(forward="fused"))
    assert not run_fused(shipped.assign(forward="reference"))
