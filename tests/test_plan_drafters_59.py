"""Issue 59, item 1 for the capacity plan: any drafter's measured chains planned per batch, its
weights and KV cache in the memory fit instead of the Medusa heads; what the plan cannot price
(a draft model without its config, a load with another drafter) is one line."""

from __future__ import annotations

import dataclasses

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.models.checkpoints_dir import CHECKPOINTS
from perfmodel.models.config import load_model
from perfmodel.planning.capacity import plan
from perfmodel.planning.lengths import Lengths
from perfmodel.planning.memory import feature_head_bytes, linear_params, weight_params
from perfmodel.planning.workload import Targets, Workload
from perfmodel.serving.capacity import serve
from perfmodel.serving.summary import summary
from reports.commands.plan import main as plan_command

RATES = (0.8, 0.6, 0.4)


def test_an_eagle3_plan_holds_its_head_not_the_heads_and_runs_chains_up_to_the_rates():
    medusa = plan("llama-3-8b", ["h100"], batches=(1, 64))
    eagle3 = plan("llama-3-8b", ["h100"], batches=(1, 64), drafter="eagle3", position_rates=RATES)
    (m,), (e,) = medusa.devices.itertuples(), eagle3.devices.itertuples()
    target = load_model("llama-3-8b")
    head = feature_head_bytes("eagle3", dataclasses.replace(target, num_layers=1), target, "fp16")
    assert e.heads_gb == pytest.approx(head / 1e9) and e.heads_gb < m.heads_gb
    assert head == 2 * (
        linear_params("eagle3_fc", target)
        + sum(linear_params(op, target) for op in ("eagle3_qkv", "o", "up", "gate", "down"))
        + 2 * target.hidden_size
    )
    # a chain of at most 3 drafts (4 tokens) at its measured tokens per step
    assert set(eagle3.configs["tree_size"]) == {1, 2, 3, 4}
    one = eagle3.bands.set_index("batch").loc[1]
    assert one["tree_size"] == 4 and one["acceptance"] == pytest.approx(2.8)
    assert "EAGLE-3: measured per-position acceptance 0.8 0.6 0.4" in eagle3.summary()
    assert "of the EAGLE-3 head" in eagle3.summary()


def test_a_draft_models_plan_counts_its_weights_and_kv_cache():
    config = CHECKPOINTS / "vicuna-68m"
    drafted = plan("vicuna-7b", ["a100"], batches=(1,), drafter="draft", position_rates=RATES, draft_config=config)
    plain = plan("vicuna-7b", ["a100"], batches=(1,), medusa="off")
    (d,), (p,) = drafted.devices.itertuples(), plain.devices.itertuples()
    small = load_model(config)
    assert d.heads_gb * 1e9 == pytest.approx(weight_params(small) * 2)  # its fp16 weights, counted
    assert d.heads_gb > 0.1 and d.kv_mb_per_token > p.kv_mb_per_token  # its own KV cache beside the target's


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--drafter", "ngram"], "give --position-rates"),
        (["--position-rates", "0.5"], "name it with --drafter"),
        (["--drafter", "draft", "--position-rates", "0.5"], "give --draft-config"),
    ],
)
def test_what_a_plan_cannot_price_is_one_line(argv, words):
    with pytest.raises(PerfkitError, match=words):
        plan_command(["--model", "llama-3-8b", "--gpu", "h100", *argv])


def test_the_serving_search_runs_another_drafters_chains_and_says_whose():
    workload = Workload(Lengths(512, 900), Lengths(128, 200), rate=20.0, requests=200)
    answer = serve(
        "llama-3-8b",
        ["h100"],
        workload,
        Targets(tpot_s=0.03),
        tensor_parallel=1,
        drafter="eagle3",
        position_rates=RATES,
    )
    on = answer.among("h100-sxm", "auto").best
    off = answer.among("h100-sxm", "off").best
    assert on.schedule.drafter == "eagle3" and {b.tree_size for b in on.schedule.bands} <= {1, 2, 3, 4}
    assert on.tpot_p90_s < off.tpot_p90_s  # the chains cut the time per token at this load
    text = summary(answer)
    assert "Best per device and EAGLE-3 setting:" in text and "Medusa" not in text
