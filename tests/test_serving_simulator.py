"""The serving simulation against the step model it is built on: unloaded, each request's
latencies are the step model's; flooded, the replica makes max batch / step time tokens."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from perfmodel.acceptance.rates import PAPER_ACCEPTANCE
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.planning.lengths import Lengths
from perfmodel.planning.step_models import flavor_steps
from perfmodel.planning.workload import Requests, Targets, Workload, read_trace
from perfmodel.serving.costs import CostBounds, tabulate_costs
from perfmodel.serving.simulator import EngineConfig, certain_miss, simulate

PROMPT, OUTPUT = 256, 256


@pytest.fixture(scope="module")
def step():
    view = resolve_devices(["h100"])[0]
    return flavor_steps(view, load_model("llama-7b"), "fp16", 1)["full"]


def costs_at(step, tree: int, max_seqs: int = 64, capacity: int = 10**7):
    bounds = CostBounds(max_seqs, 2048, capacity, tree)
    return tabulate_costs(step, PAPER_ACCEPTANCE, lambda b, s: np.full(np.shape(b), tree), bounds, "t", tree > 1)


def fixed(rate: float, prompt: int = PROMPT, output: int = OUTPUT, requests: int = 200) -> Workload:
    return Workload(Lengths.of(prompt), Lengths.of(output), rate, requests=requests)


@pytest.mark.parametrize("tree", [1, 16])
@pytest.mark.parametrize("prefill", ["separate", "chunked"])
def test_low_load_latency_is_the_unloaded_step_models(step, tree, prefill):
    run = simulate(fixed(0.02).sample(), costs_at(step, tree), EngineConfig(prefill))
    context = PROMPT + OUTPUT / 2  # the mean context over a request's decoding
    tokens = float(PAPER_ACCEPTANCE(tree)) if tree > 1 else 1.0
    tpot = float(step.step_time(1, context, tree)) / tokens
    ttft = float(step.prefill_time(1, PROMPT, tree > 1))
    for q in (50, 90):
        assert run.percentile("tpot_s", q) == pytest.approx(tpot, rel=0.02)
        assert run.percentile("ttft_s", q) == pytest.approx(ttft, rel=0.02)
    assert run.mean_batch < 1.05  # requests seldom overlap


@pytest.mark.parametrize("tree", [1, 8])
def test_saturated_throughput_is_max_batch_over_step_time(step, tree):
    max_seqs, prompt, output = 32, 16, 1024  # short prompts: prefill is a sliver of the time
    run = simulate(fixed(1e9, prompt, output, 400).sample(), costs_at(step, tree, max_seqs), EngineConfig())
    tokens = float(PAPER_ACCEPTANCE(tree)) if tree > 1 else 1.0
    expected = max_seqs * tokens / float(step.step_time(max_seqs, prompt + output / 2, tree))
    assert run.tokens_s == pytest.approx(expected, rel=0.05)
    assert run.mean_batch == pytest.approx(max_seqs, rel=0.05)


def test_kv_capacity_limits_the_batch(step):
    need = PROMPT + OUTPUT
    run = simulate(fixed(1e9).sample(), costs_at(step, 1, 64, capacity=4 * need), EngineConfig())
    assert run.mean_batch <= 4 + 1e-9
    assert run.mean_batch > 3


def test_more_load_means_more_queueing(step):
    costs = costs_at(step, 1)
    light, heavy = (simulate(fixed(rate).sample(), costs) for rate in (1, 40))
    assert heavy.percentile("ttft_s", 90) > light.percentile("ttft_s", 90)
    assert heavy.percentile("tpot_s", 90) > light.percentile("tpot_s", 90)
    assert heavy.tokens_s > light.tokens_s


def test_a_request_longer_than_the_cache_is_a_one_line_error(step):
    with pytest.raises(PerfkitError, match=r"request 0 \(256 prompt \+ 256 output tokens\) needs more KV cache"):
        simulate(fixed(1).sample(), costs_at(step, 1, capacity=300))


def test_a_trace_is_read_sorted_and_checked(tmp_path):
    path = tmp_path / "trace.csv"
    rows = [(f"{(12 - i) * 0.5}", 100 + i, 20) for i in range(12)]
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(",".join(map(str, r)) for r in rows))
    requests = read_trace(path)
    assert requests.arrival_s[0] == 0 and (np.diff(requests.arrival_s) >= 0).all()
    assert requests.prompt[0] == 111  # the earliest arrival
    assert requests.at_rate(4.0).rate == pytest.approx(4.0)
    path.write_text("arrival_s,prompt_tokens\n" + "\n".join(f"{i},5" for i in range(12)))
    with pytest.raises(PerfkitError, match="lacks column.*output_tokens"):
        read_trace(path)
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(f"{i},5,{i - 3}" for i in range(12)))
    with pytest.raises(PerfkitError, match="row 2: .*token counts integers >= 1"):
        read_trace(path)


def test_lengths_are_drawn_with_the_asked_mean_and_p95():
    w = Workload(Lengths(1000, 2000), Lengths(256, 256), 1.0, requests=5000)
    requests = w.sample()
    assert np.mean(requests.prompt) == pytest.approx(1000, rel=0.05)
    assert np.percentile(requests.prompt, 95) == pytest.approx(2000, rel=0.05)
    assert (requests.output == 256).all()
    with pytest.raises(PerfkitError, match="no log-normal has a tail that heavy"):
        Workload(Lengths(100, 1000), rate=1.0).sample()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rate=0), "request rate must be a positive number, got 0"),
        (dict(rate=float("nan")), "request rate must be a positive number"),
        (dict(rate=1, requests=3), "requests must be an integer >= 10"),
        (dict(prompt=512), r"prompt must be a Lengths \(Lengths.of\(...\) reads a count, pair or samples\)"),
    ],
)
def test_bad_workloads_are_one_line_errors(kwargs, message):
    with pytest.raises(PerfkitError, match=message):
        Workload(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(latency_s=-0.01), "latency_s must be a positive number, got -0.01"),
        (dict(tpot_s=0), "tpot_s must be a positive number, got 0"),
        (dict(percentile=95), "percentile 95 is not offered; choose one of: 50, 90, 99"),
    ],
)
def test_bad_targets_are_one_line_errors(kwargs, message):
    with pytest.raises(PerfkitError, match=message):
        Targets(**kwargs)


def test_bad_engine_settings_are_one_line_errors():
    with pytest.raises(PerfkitError, match="unknown prefill mode 'mixed'; choose one of: separate, chunked"):
        EngineConfig("mixed")
    with pytest.raises(PerfkitError, match="chunk_tokens must be a positive integer, got 0"):
        EngineConfig("chunked", 0)


def vectorised_steps(costs, batch, context, tokens, tree, left, until):
    """ServingCosts' steps as numpy computes them, each step at once: the reference the
    loop's plain-float lookup must reproduce."""
    count = max(1, int(np.ceil(left / tokens - 1e-9)))
    ahead = context + tokens * np.arange(count)
    row, c = batch - 1, costs.contexts
    nearest = np.abs(c[:, None] - ahead[None, :]).argmin(axis=0)
    same_tree = costs.tree[row, nearest] == tree
    count = max(1, int(np.argmin(same_tree)) if not same_tree.all() else count)
    seconds = np.interp(ahead[:count], c, costs.step_s[row])
    starts = np.concatenate([[0.0], np.cumsum(seconds)[:-1]])
    count = max(1, int(np.searchsorted(starts, until, side="left")))
    return count, float(seconds[:count].sum())


def test_the_loops_step_lookup_is_numpys_arithmetic(step):
    # a schedule whose tree changes with context, so runs of steps stop where the tree does
    costs = tabulate_costs(
        step,
        PAPER_ACCEPTANCE,
        lambda b, s: np.where(np.asarray(s) < 300, 16, 1),
        CostBounds(8, 2048, 10**7, 16),
        "t",
        True,
    )
    rng = np.random.default_rng(0)
    for _ in range(300):
        batch, context = int(rng.integers(1, 9)), float(rng.uniform(0.5, 2500))
        seconds, tokens, tree = costs.step(batch, context)
        assert seconds == pytest.approx(np.interp(context, costs.contexts, costs.step_s[batch - 1]), rel=1e-12)
        left, until = float(rng.uniform(0, 300)), float(rng.choice([rng.uniform(0, 2), np.inf]))
        count, total = costs.lookup.steps(batch, context, tokens, tree, left, until)
        expected_count, expected_total = vectorised_steps(costs, batch, context, tokens, tree, left, until)
        assert count == expected_count
        assert total == pytest.approx(expected_total, rel=1e-12)
    lengths = [0, 1, 7, 300, 2048, 5000]
    assert [costs.lookup.prefill(n) for n in lengths] == costs.prefill(lengths).tolist()


@pytest.mark.parametrize("q", [50, 90, 95, 99])
def test_a_certain_miss_is_a_percentile_over_the_target(q):
    rng = np.random.default_rng(q)
    for n in range(1, 80):
        over = certain_miss(n, q)
        assert 1 <= over <= n
        # the most favourable case for the percentile: the rest far under the target
        values = np.concatenate([rng.uniform(1.0001, 2, over), rng.uniform(0, 1e-3, n - over)])
        rng.shuffle(values)
        assert np.percentile(values, q) > 1.0


def test_giving_up_changes_no_decision_of_the_search(step):
    costs = costs_at(step, 1)
    requests = fixed(1).sample()
    targets = Targets(ttft_s=0.05, tpot_s=0.012)
    stopped = 0
    for rate in (1, 5, 10, 20, 40, 80):
        full = simulate(requests.at_rate(rate), costs)
        early = simulate(requests.at_rate(rate), costs, give_up=targets)
        met = targets.met(full.percentile("ttft_s", 90), full.percentile("tpot_s", 90))
        if early.missed:
            stopped += 1
            assert not met
            assert early.duration_s < full.duration_s  # it stopped early
        else:
            assert (early.tokens_s, early.duration_s) == (full.tokens_s, full.duration_s)
            assert early.percentile("ttft_s", 90) == full.percentile("ttft_s", 90)
    assert 0 < stopped < 6  # both kinds of run were seen


def test_gains_of_one_change_nothing(step):
    requests = fixed(30, requests=300).sample()
    costs = costs_at(step, 8, max_seqs=16)
    alike = simulate(requests, costs, EngineConfig("chunked"))
    ones = simulate(replace(requests, gain=np.ones(len(requests))), costs, EngineConfig("chunked"))
    for name in ("first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(ones, name), getattr(alike, name))
    assert ones.tokens_s == alike.tokens_s and ones.mean_batch == alike.mean_batch


def test_a_request_gaining_twice_the_tokens_a_step_decodes_in_half_the_steps(step):
    # two requests far apart (each alone), the second drafting twice the first's tokens a step
    n = np.full(2, 1)
    requests = Requests(np.array([0.0, 100.0]), n * PROMPT, n * OUTPUT, "two", np.array([1.0, 2.0]))
    run = simulate(requests, costs_at(step, 1), EngineConfig("chunked"))
    steps = OUTPUT - 1, math.ceil((OUTPUT - 1) / 2)  # the same contexts, read twice as fast
    assert run.tpot_s[1] / run.tpot_s[0] == pytest.approx(steps[1] / steps[0], rel=0.01)
    assert run.ttft_s[1] == pytest.approx(run.ttft_s[0])


def test_sequences_of_other_gains_share_a_batch_and_finish_in_their_own_order(step):
    # four requests at once, the same output: the one gaining most finishes first, and the
    # tokens made are their outputs, none past their ends
    gain = np.array([1.0, 1.5, 2.0, 3.0])
    n = np.full(4, 1)
    requests = Requests(np.zeros(4), n * PROMPT, n * OUTPUT, "four", gain)
    run = simulate(requests, costs_at(step, 1), EngineConfig("chunked"))
    assert (np.diff(run.finish_s) < 0).all()
    # three times the steps, a little under three times the time: its later steps run fewer sequences
    assert run.tpot_s[0] / run.tpot_s[3] == pytest.approx(3, rel=0.1)


def test_gains_must_be_one_positive_number_per_request():
    n = np.full(2, 1)
    with pytest.raises(PerfkitError, match=r"request gains must be one positive number per request \(2\)"):
        Requests(np.zeros(2), n, n, "two", np.array([1.0, 0.0]))
