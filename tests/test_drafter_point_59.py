"""Issue 59, item 1 (EAGLE and draft models): one tree or chain of any drafter priced at one
batch and context, drafting and verification apart."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.planning.deployment import resolve
from perfmodel.planning.drafter_point import DraftedShape, drafter_point, tokens_per_step
from perfmodel.planning.drafters import draft_model_drafter, drafters_for
from reports.commands.speedup import main as speedup


@pytest.fixture(scope="module")
def steps():
    (deployment,) = resolve("vicuna-7b", "a100-sxm")
    return deployment.steps(["full"])


def test_an_eagle_tree_is_its_passes_then_its_verification(steps):
    (eagle,) = drafters_for("eagle")
    row = drafter_point(steps, eagle, DraftedShape.of(26, None), 1, 1024, 3.6).iloc[0]
    assert row["draft_passes"] == 6  # EAGLE-2's depth: min(6, 25) passes
    assert row["draft_ms"] > 0 and row["verify_ms"] > row["plain_step_ms"]
    assert row["draft_ms"] + row["verify_ms"] == pytest.approx(row["step_ms"])
    assert row["speedup"] == pytest.approx(3.6 / row["overhead"])
    assert row["ms_per_token"] == pytest.approx(row["step_ms"] / 3.6)


def test_a_chain_of_k_drafts_is_k_passes_of_one_token(steps):
    (eagle,) = drafters_for("eagle")
    chain = drafter_point(steps, eagle, DraftedShape.of(None, 4), 1, 1024, 3.0).iloc[0]
    tree = drafter_point(steps, eagle, DraftedShape.of(5, None), 1, 1024, 3.0).iloc[0]
    assert (chain["draft_passes"], chain["tokens_verified"]) == (4, 5)
    # the same 5 tokens verified; each of the chain's passes runs one node, a tree's later ones its top-k
    assert chain["verify_ms"] == pytest.approx(tree["verify_ms"])
    shape = DraftedShape.of(None, 4).drafter(eagle).shape
    assert [int(t) for t in shape.pass_tokens(5)] == [1, 1, 1, 1]
    assert [int(t) for t in eagle.shape.pass_tokens(5)] == [1, 4, 4, 4]


def test_a_draft_models_drafting_is_gamma_steps_at_its_cost_ratio(steps):
    drafter = draft_model_drafter(cost_ratio=0.05)
    row = drafter_point(steps, drafter, DraftedShape.of(None, 4), 8, 512, 2.5).iloc[0]
    assert row["draft_ms"] == pytest.approx(0.05 * 4 * row["plain_step_ms"])


@pytest.mark.parametrize(
    "tree_size, chain, acceleration, message",
    [
        (None, 0, 1.0, "--chain 0: a chain has at least one draft"),
        (1, None, 1.0, "--tree-size 1: a speculative step verifies the root and at least one candidate"),
        (26, 3, 1.0, "give the shape as one of --tree-size T"),
        (None, 3, 4.5, "--acceleration 4.5: a chain of 3 draft.s. verified by eagle yields 1 to 4 tokens"),
        (26, None, 7.5, "--acceleration 7.5: a 26-token tree .* yields 1 to 7 tokens"),
    ],
)
def test_bad_shapes_and_accelerations_are_refused_in_one_line(steps, tree_size, chain, acceleration, message):
    (eagle,) = drafters_for("eagle")
    with pytest.raises(PerfkitError, match=message):
        drafter_point(steps, eagle, DraftedShape.of(tree_size, chain), 1, 512, acceleration)


def test_the_command_answers_for_eagle_with_drafting_and_verification_apart(tmp_path, capsys):
    csv = tmp_path / "point.csv"
    args = ["--gpu", "a100-sxm", "--model", "vicuna-7b", "--drafter", "eagle", "--tree-size", "26"]
    assert speedup([*args, "--acceleration", "3.6", "--batch", "1", "--step", "full", "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "eagle drafting a 26-token tree" in out and "= drafting " in out and "+ verification " in out
    # the engine's sampler and host work are not in the full step: the answer says so above it
    assert out.index("full leaves out: the sampler (a rejection sampler") < out.index("full: plain step")
    rows = pd.read_csv(csv)
    assert list(rows[["drafter", "tokens_verified", "source"]].iloc[0]) == ["eagle", 26, "predicted"]
    with pytest.raises(PerfkitError, match="--drafter all: one point is priced for one drafter"):
        speedup(["--gpu", "a100-sxm", "--drafter", "all", "--chain", "3", "--acceleration", "2"])


def test_per_position_rates_give_the_tokens_per_step_of_their_chain(tmp_path, capsys):
    assert tokens_per_step([0.8, 0.6, 0.4]) == pytest.approx(2.8)
    csv = tmp_path / "rates.csv"
    base = ["--gpu", "h100", "--model", "vicuna-7b", "--drafter", "eagle", "--step", "full", "--csv", str(csv)]
    assert speedup([*base, "--position-rates", "0.8", "0.6", "0.4"]) == 0
    row = pd.read_csv(csv).iloc[0]
    assert (row["tokens_verified"], row["draft_passes"], row["acceleration"]) == (4, 3, pytest.approx(2.8))


@pytest.mark.parametrize(
    "rates, extra, message",
    [
        (["0.6", "0.8"], [], "position 2's 0.8 exceeds position 1's 0.6"),
        (["0.8", "0.6"], ["--acceleration", "2"], "give one of --acceleration or --position-rates"),
        (["0.8", "0.6", "0.4"], ["--chain", "2"], "3 rate.s. for a chain of 2 draft.s."),
    ],
)
def test_bad_position_rates_are_refused_in_one_line(rates, extra, message):
    with pytest.raises(PerfkitError, match=message):
        speedup(["--gpu", "h100", "--drafter", "eagle", "--position-rates", *rates, *extra])


def test_a_rate_outside_0_to_1_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        speedup(["--gpu", "h100", "--drafter", "eagle", "--position-rates", "0.6", "1.2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "must be a number from 0 to 1" in err


def test_a_point_is_priced_at_a_degree_that_holds_the_model(capsys):
    # a 13B model in fp16 is 26 GB: one 24 GB card does not hold it, so --tp 1 is refused naming
    # a degree that does, and --tp auto prices the capacity plan's degree and says so
    argv = ["--gpu", "rtx-4090", "--model", "llama-13b", "--drafter", "eagle"]
    point = ["--chain", "3", "--acceleration", "2.8", "--step", "full"]
    with pytest.raises(PerfkitError, match="--tp 2"):
        speedup([*argv, *point, "--tp", "1"])
    assert speedup([*argv, *point, "--tp", "auto"]) == 0
    out = capsys.readouterr().out
    assert "--tp auto chose 4" in out and "tensor parallel 4" in out
