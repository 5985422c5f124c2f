"""Issue 59, items 1 and 3 for schedules: any drafter but the Medusa heads scheduled from its
measured per-position acceptance (vLLM's /metrics), band by band over batch and context, its
chains priced as python -m perfmodel.speedup prices one; bad requests refused in one line."""

from __future__ import annotations

import pytest

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.models.checkpoints_dir import CHECKPOINTS
from perfmodel.planning.deployment import resolve
from perfmodel.planning.drafter_point import DraftedShape, drafter_point, point_drafter
from perfmodel.planning.measured_chain import ChainAcceptance
from perfmodel.planning.schedule import ScheduleRequest, schedule_deployment
from perfmodel.planning.schedule_format import SpeculationSchedule

RATES = (0.8, 0.6, 0.4)


def test_a_chains_tokens_per_step_are_one_plus_its_measured_rates():
    accepts = ChainAcceptance(RATES)
    assert accepts([1, 2, 3, 4]) == pytest.approx([1.0, 1.8, 2.4, 2.8])
    with pytest.raises(PerfkitError, match="cover chains of 0 to 3"):
        accepts(5)


def test_an_eagle3_schedule_runs_the_chain_speedup_prices_at_each_point():
    (deployment,) = resolve("llama-3-8b", "h100-sxm")
    request = ScheduleRequest(batches=(1, 1024), contexts=(512,), drafter="eagle3", position_rates=RATES)
    schedule = schedule_deployment(deployment, request)
    first = schedule.band(1, 512)
    assert (first.drafter, first.top_k, first.tree_size) == (DrafterKind.EAGLE3, 1, first.depth + 1)
    assert first.acceptance == pytest.approx(1 + sum(RATES[: first.depth]))
    # the band's speedup is the point answer's for the same chain (one grid point: batch 1)
    (row,) = drafter_point(
        deployment.steps(["full"]),
        point_drafter(DrafterKind.EAGLE3, deployment.model),
        DraftedShape.of(None, first.depth),
        1,
        512,
        first.acceptance,
    ).itertuples()
    assert first.speedup == pytest.approx(row.speedup, rel=1e-9)
    # at a batch of 1024 the step is compute-bound: a poor chain's drafts no longer pay there
    poor = schedule_deployment(
        deployment, ScheduleRequest(batches=(1, 1024), contexts=(512,), drafter="eagle3", position_rates=(0.3, 0.1))
    )
    assert poor.band(1, 512).speculate and not poor.band(1024, 512).speculate
    again = SpeculationSchedule.from_json(schedule.to_json())
    assert again.bands == schedule.bands and again.drafter == "eagle3"


def test_a_draft_models_schedule_prices_its_own_steps_from_its_config():
    (deployment,) = resolve("vicuna-7b", "a100-sxm")
    own = ScheduleRequest(
        batches=(1,), contexts=(512,), drafter="draft", position_rates=RATES, draft_config=CHECKPOINTS / "vicuna-68m"
    )
    ratio = ScheduleRequest(batches=(1,), contexts=(512,), drafter="draft", position_rates=RATES, cost_ratio=0.5)
    cheap, dear = schedule_deployment(deployment, own).bands[0], schedule_deployment(deployment, ratio).bands[0]
    assert "vicuna-68m" in schedule_deployment(deployment, own).acceptance or cheap.speedup > dear.speedup
    assert cheap.speedup > dear.speedup  # a 68M model's steps cost far less than half the target's


@pytest.mark.parametrize(
    "request_fields, words",
    [
        (dict(drafter="eagle3"), "--drafter eagle3 is scheduled from its measured per-position acceptance"),
        (dict(drafter="ngram"), "give --position-rates"),
        (dict(drafter="medusa", position_rates=RATES), "not --drafter medusa"),
        (dict(drafter="best", position_rates=RATES), "not --drafter best"),
        (dict(drafter="eagle3", position_rates=(0.4, 0.6)), "position 2's 0.6 exceeds position 1's 0.4"),
        (dict(drafter="draft", draft_config=CHECKPOINTS / "vicuna-68m"), "--draft-config goes with --position-rates"),
        (dict(drafter="eagle", position_rates=RATES, acceptance="eagle"), "give one of --position-rates or"),
    ],
)
def test_a_bad_chain_schedule_request_is_one_line(request_fields, words):
    (deployment,) = resolve("llama-3-8b", "h100-sxm")
    with pytest.raises(PerfkitError, match=words):
        schedule_deployment(deployment, ScheduleRequest(batches=(1,), contexts=(512,), **request_fields))


def test_mtp_needs_a_checkpoint_that_carries_a_module():
    (deployment,) = resolve("llama-3-8b", "h100-sxm")
    with pytest.raises(PerfkitError, match="declares no MTP module"):
        schedule_deployment(deployment, ScheduleRequest(batches=(1,), drafter="mtp", position_rates=RATES))


def exported(tmp_path, argv: list[str]) -> dict[str, str]:
    from perfmodel.schedule import main as schedule

    assert schedule(["--gpu", "h100", "--context", "1024", "--out", str(tmp_path), *argv]) == 0
    files = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    return {name: text for name, text in files.items() if "chain-2" in name}


def test_each_engine_gets_its_own_keys_for_a_measured_chain(tmp_path, capsys):
    import json

    import yaml

    head = "org/eagle3-head"
    files = exported(
        tmp_path / "e3",
        ["--model", "llama-3-8b", "--drafter", "eagle3", "--position-rates", "0.7", "0.5", "--heads", head],
    )
    assert json.loads(files["vllm/speculative-config.eagle3-chain-2.json"]) == {
        "method": "eagle3",
        "model": head,
        "num_speculative_tokens": 2,
    }
    args = files["sglang/server-args.eagle3-chain-2.txt"].splitlines()[-1].split()
    assert args == [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", head,
        "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3",
    ]  # fmt: skip
    trt = yaml.safe_load(files["tensorrt-llm/extra-llm-api-options.eagle3-chain-2.yaml"])["speculative_config"]
    assert trt == {
        "decoding_type": "Eagle",
        "max_draft_len": 2,
        "speculative_model_dir": head,
        "eagle3_one_model": True,
    }
    mimo = str(CHECKPOINTS / "mimo-7b-rl")
    files = exported(tmp_path / "mtp", ["--model", mimo, "--drafter", "mtp", "--position-rates", "0.7", "0.5"])
    assert json.loads(files["vllm/speculative-config.mtp-chain-2.json"]) == {
        "method": "mtp",
        "num_speculative_tokens": 2,
    }
    assert "--speculative-draft-model-path" not in files["sglang/server-args.mtp-chain-2.txt"]
    trt = yaml.safe_load(files["tensorrt-llm/extra-llm-api-options.mtp-chain-2.yaml"])["speculative_config"]
    assert trt == {"decoding_type": "MTP", "num_nextn_predict_layers": 2}
    files = exported(tmp_path / "ng", ["--model", "llama-3-8b", "--drafter", "ngram", "--position-rates", "0.7", "0.5"])
    vllm = json.loads(files["vllm/speculative-config.ngram-chain-2.json"])
    assert vllm == {"method": "ngram", "prompt_lookup_max": 5, "prompt_lookup_min": 2, "num_speculative_tokens": 2}
    assert (
        "--speculative-algorithm NGRAM --speculative-num-draft-tokens 3"
        in files["sglang/server-args.ngram-chain-2.txt"]
    )
    trt = yaml.safe_load(files["tensorrt-llm/extra-llm-api-options.ngram-chain-2.yaml"])
    assert trt["speculative_config"]["max_draft_len"] == 2 and trt["speculative_config"]["is_public_pool"] is False
    out = capsys.readouterr().out
    assert "n-gram lookup chain K=2" in out and "MTP chain K=2" in out and "EAGLE-3 chain K=2" in out


def test_weights_for_a_drafter_that_loads_none_are_refused(tmp_path):
    from perfmodel.schedule import main as schedule

    mimo = str(CHECKPOINTS / "mimo-7b-rl")
    argv = ["--gpu", "h100", "--model", mimo, "--drafter", "mtp", "--position-rates", "0.7", "--heads", "org/x"]
    with pytest.raises(PerfkitError, match="MTP loads no weights of its own"):
        schedule([*argv, "--engine", "json", "--out", str(tmp_path / "x")])


def test_tp_auto_plans_the_drafters_own_chains():
    # --tp auto's degree comes from the capacity plan of the drafter the schedule runs (its
    # chains' steps and its weights), not the Medusa heads' step at the chain's acceptance
    from perfmodel.planning.capacity import plan_deployments
    from perfmodel.planning.deployment import DeploymentChoices, resolve
    from perfmodel.schedule import plan_request

    request = plan_request("eagle3", None, (0.8, 0.6))
    assert (request.drafter, request.position_rates) == ("eagle3", (0.8, 0.6))
    (deployment,) = resolve("llama-3-8b", ["h100-sxm"], DeploymentChoices(tensor_parallel=None))
    result = plan_deployments(deployment, request)
    assert result.drafter == "eagle3" and set(result.configs["tree_size"]) <= {1, 2, 3}


def test_tp_auto_refuses_a_draft_models_plan_without_its_config(tmp_path):
    from perfmodel.schedule import main as schedule

    argv = ["--gpu", "h100", "--model", "llama-3-8b", "--tp", "auto", "--drafter", "draft", "--position-rates", "0.7"]
    with pytest.raises(PerfkitError, match="give --draft-config"):
        schedule([*argv, "--engine", "json", "--out", str(tmp_path / "x")])
