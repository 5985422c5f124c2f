"""The serving answer: capacity within latency targets per device, degree and Medusa
setting, the devices a rate needs, typed results, and the plan command's --rate, --json and
--medusa."""

from __future__ import annotations

import json
import math

import pytest

import reports.commands.plan as plan_cli
from perfmodel.acceptance.rates import resolve_acceptance
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.planning.capacity import plan
from perfmodel.planning.deployment import DeploymentChoices, resolve
from perfmodel.planning.lengths import Lengths
from perfmodel.planning.workload import Targets, Workload
from perfmodel.serving.capacity import replica, serve
from perfmodel.serving.simulator import EngineConfig, simulate

WORKLOAD = Workload(Lengths(512, 900), Lengths(128, 200), rate=20.0, requests=300)


@pytest.fixture(scope="module")
def answer():
    return serve("llama-7b", ["h100"], WORKLOAD, Targets(ttft_s=1.0, tpot_s=0.02), tensor_parallel=None)


def test_every_usable_degree_is_searched_with_and_without_medusa(answer):
    searched = {(o.tp, o.medusa) for o in answer.options}
    assert searched == {(tp, m) for tp in (1, 2, 4, 8) for m in ("off", "auto")}
    assert all(o.device == "h100-sxm" and o.fits for o in answer.options)


def test_the_answer_meets_the_targets_at_its_load_and_needs_the_fewest_devices(answer):
    best = answer.best
    assert best is not None and best.meets_targets
    assert best.devices == min(o.devices for o in answer.options if o.meets_targets)
    assert best.replicas == math.ceil(20.0 / best.max_rate)
    assert best.load_rate == pytest.approx(20.0 / best.replicas)
    assert best.ttft_p90_s <= 1.0 and best.tpot_p90_s <= 0.02
    # More load than one replica's maximum misses a target, or falls behind.
    rep_rate = best.max_rate * 1.3
    run = simulate(WORKLOAD.sample(rep_rate), best_costs(best), EngineConfig())
    offered = rep_rate * 128
    assert run.percentile("tpot_s", 90) > 0.02 or run.percentile("ttft_s", 90) > 1.0 or run.tokens_s < 0.9 * offered


def best_costs(option):
    (deployment,) = resolve("llama-7b", ["h100"], DeploymentChoices(dtype="fp16", tensor_parallel=option.tp))
    return replica(deployment, option.medusa, resolve_acceptance("paper"), WORKLOAD).costs


def test_medusa_lowers_unloaded_time_per_token(answer):
    for tp in (1, 2):
        off, auto = (next(o for o in answer.options if o.tp == tp and o.medusa == m) for m in ("off", "auto"))
        assert auto.unloaded_tpot_s < off.unloaded_tpot_s
        assert auto.unloaded_ttft_s == pytest.approx(off.unloaded_ttft_s, rel=0.05)


def test_typed_results_go_to_a_frame_and_json_and_back(answer):
    frame = answer.to_frame()
    assert len(frame) == len(answer.options)
    assert {"device", "tp", "medusa", "devices", "ttft_p90_s", "tpot_p90_s", "max_tokens_s"} <= set(frame.columns)
    data = json.loads(answer.to_json())
    assert data["options"][data["best"]]["devices"] == answer.best.devices
    bands = data["options"][1]["schedule"]["bands"] if data["options"][1]["schedule"] else []
    assert all("tree_size" in band for band in bands)


def test_a_model_that_does_not_fit_says_so_and_is_never_the_answer():
    answer = serve("llama-2-70b", ["a100-sxm"], WORKLOAD, Targets(tpot_s=0.05), tensor_parallel=1, medusa="off")
    (option,) = answer.options
    assert not option.fits and "does not fit" in option.note
    assert answer.best is None


def test_a_degree_the_model_cannot_use_is_a_one_line_error():
    with pytest.raises(PerfkitError, match=r"tensor parallel 3 cannot be served on h100-sxm \(it does not split"):
        serve("llama-7b", ["h100"], WORKLOAD, Targets(), tensor_parallel=3)
    with pytest.raises(PerfkitError, match="unknown medusa setting 'maybe'"):
        serve("llama-7b", ["h100"], WORKLOAD, Targets(), medusa="maybe")


def test_plan_medusa_off_and_on_force_the_bands():
    off = plan("llama-7b", "h100", medusa="off")
    assert (off.bands["tree_size"] == 1).all()
    on = plan("llama-7b", "h100", medusa="on")
    assert (on.bands["tree_size"] > 1).all() and on.bands["speculate"].all()
    auto = plan("llama-7b", "h100")
    assert (auto.bands["speedup"] >= on.bands["speedup"] - 1e-12).all()


def test_plan_results_are_typed_and_serialise():
    result = plan("llama-7b", ["h100", "a100"], latency_target_s=0.03)
    (h100, a100) = result.recommendations
    assert h100.device == "h100-sxm" and isinstance(h100.max_batch, int)
    assert result.to_frame()["device"].tolist() == ["h100-sxm", "a100-pcie"]
    data = json.loads(result.to_json())
    assert data["devices"][0]["batch"] == h100.batch and data["source"] == "predicted"
    assert {b["device"] for b in data["bands"]} == {"h100-sxm", "a100-pcie"}


def test_the_plan_command_answers_a_rate_in_json(capsys):
    argv = ["--model", "llama-7b", "--gpu", "h100", "--tp", "auto", "--rate", "20", "--prompt-len", "512", "900"]
    argv += ["--response-len", "128", "200", "--tpot-ms", "20", "--ttft-ms", "1000", "--json"]
    assert plan_cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    serving = data["serving"]
    best = serving["options"][serving["best"]]
    assert best["meets_targets"] and best["devices"] >= best["tp"]
    assert serving["targets"] == {"ttft_s": 1.0, "tpot_s": 0.02, "percentile": 90, "tokens_s": None}
    assert data["plan"]["devices"][0]["device"] == "h100-sxm"


def test_the_plan_command_prints_the_answer_first(capsys):
    argv = ["--model", "llama-7b", "--gpu", "h100", "--rate", "5", "--tpot-ms", "30", "--medusa", "off"]
    assert plan_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("Serving llama-7b: 5 requests/s")
    assert out.splitlines()[1].startswith("Answer: h100-sxm tp 1, Medusa off:")
    assert "Medusa auto" not in out and out.index("Answer:") < out.index("Capacity plan, unloaded")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tpot-ms", "50"], "--ttft-ms and --tpot-ms need a load to hold at"),
        (["--rate", "5", "--percentile", "95"], "invalid choice: 95"),
        (["--rate", "-1"], "must be a number > 0, got '-1'"),
        (["--rate", "5", "--medusa", "maybe"], "invalid choice: 'maybe'"),
        (["--rate", "5", "--prompt-len", "1", "2", "3"], "--prompt-len takes a mean and optionally a p95, got 3"),
    ],
)
def test_bad_serving_options_are_one_line_errors(argv, message, capsys):
    try:
        status = run(plan_cli.main, ["--model", "llama-7b", "--gpu", "h100", *argv])
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    assert status != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and len(err) <= 2  # argparse prints its usage line first
