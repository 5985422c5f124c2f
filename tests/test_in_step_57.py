"""Issue #57, the CPU closed loop: the per-operator profile of the decoder's step, measured
inside the step, beside the price of the same operators timed alone."""

from __future__ import annotations

import pytest
import torch

from decoder.checkpoint import load_checkpoint
from decoder.medusa import Decoder
from decoder.runs import heldout_prompts
from decoder.tree import Drafting
from perfmodel.acceptance.trees import Tree
from profilers.closed_loop.in_step import HOST, REST_OPS, beside_priced, in_step_profile
from profilers.closed_loop.tree_kind import TreeKind
from reports.commands.validate import main as validate_main

LEAVES = ("q", "k", "v", "o", "gate", "up", "down", "norm", "embed", "lm_head")


@pytest.fixture(scope="module")
def decoder():
    torch.manual_seed(0)
    return Decoder(load_checkpoint("bundled"), "cpu")


def test_every_operator_of_the_step_is_profiled_and_the_parts_add_up(decoder):
    prompts = heldout_prompts(decoder.ckpt, 1, 32, seed=0)
    settings = {(TreeKind.PLAIN, 1): {}, (TreeKind.STATIC, 2): {"drafting": Drafting(Tree(((0,),)))}}
    profile = in_step_profile(decoder, prompts, settings, new_tokens=6, rounds=1)
    for key, part in profile.groupby(["tree_kind", "tree_size"]):
        ops = dict(zip(part["op"], part["in_step_s"]))
        assert set(LEAVES) <= set(ops) and set(REST_OPS) <= set(ops)
        assert all(ops[op] > 0 for op in LEAVES), ops
        # the Medusa heads run in a tree step's candidates part only
        assert ("medusa_heads" in ops) == (key[0] == TreeKind.STATIC)
    assert (profile["hook_s"] > 0).all()  # what a pair of hooks costs a call, taken out of the parts


def test_the_profile_is_held_against_the_price_of_the_operators_it_holds():
    import pandas as pd

    profile = pd.DataFrame(
        {
            "tree_kind": ["plain"] * 3,
            "tree_size": [1] * 3,
            "op": ["q", "norm", "attention (rope, kv write, sdpa)"],
            "in_step_s": [2e-4, 3e-4, 5e-4],
        }
    )
    prices = {
        ("plain", 1): {
            "q": 1e-4,
            "norm": 2e-4,
            "final_norm": 1e-4,
            "rope": 1e-4,
            "kv_write": 1e-4,
            "sdpa": 2e-4,
            HOST: 5e-5,
        }
    }
    beside = beside_priced(profile, prices).set_index("op")
    assert beside.loc["q", "priced_s"] == pytest.approx(1e-4)
    assert beside.loc["norm", "priced_s"] == pytest.approx(3e-4)  # the final norm is a norm module too
    assert beside.loc["attention (rope, kv write, sdpa)", "priced_s"] == pytest.approx(4e-4)
    assert beside.loc[HOST, "priced_s"] == pytest.approx(5e-5)
    assert beside.loc["q", "difference_s"] == pytest.approx(1e-4)


def test_validate_prints_the_in_step_profile_beside_the_prices(capsys):
    argv = ["--sizes", "2", "--prompts", "1", "--new-tokens", "8", "--budget", "0.001", "--rounds", "1", "--in-step"]
    assert validate_main(argv) == 0
    out = capsys.readouterr().out
    assert "each operator inside the step (hooks on) / priced, ms per step:" in out
    table = out.split("each operator inside the step")[1]
    for row in ("norm", "gate", "medusa_heads", "attention (rope, kv write, sdpa)", HOST):
        assert row in table
