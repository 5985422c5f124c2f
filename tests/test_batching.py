"""How many tokens a batch makes of each step: simulated step counts, survival curves."""

import numpy as np
import pytest

from perfmodel.batching import (
    acceptance_survival,
    attended_context,
    batch_acceptance,
    dynamic_survival,
    probability_calibration,
    simulated_steps,
)
from perfmodel.errors import PerfkitError
from perfmodel.trees import expected_acceptance, greedy_tree


def test_survival_curve_adds_up_to_the_expected_acceptance():
    accuracy = np.array([[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.05]])
    tree = greedy_tree(accuracy, 12)
    survival = acceptance_survival(tree, accuracy)
    assert survival[0] == 1 and (np.diff(survival) <= 0).all()
    assert survival.sum() == pytest.approx(expected_acceptance(tree, accuracy))


def test_a_step_never_emits_past_the_token_budget():
    # every step accepts exactly 3 tokens: 10 tokens take 4 steps, the last one cut to 1
    steps = simulated_steps([np.array([1.0, 1.0, 1.0])], 10, draws=5)
    assert (steps == 4).all()
    assert batch_acceptance([np.array([1.0, 1.0, 1.0])], 1, 10) == pytest.approx(10 / 4)


def test_a_batch_waits_for_its_slowest_prompt():
    tree = greedy_tree(np.full((2, 3), 0.5), 3)
    easy, hard = np.full((2, 3), 0.3), np.full((2, 3), 0.05)
    a_easy, a_hard = expected_acceptance(tree, easy), expected_acceptance(tree, hard)
    survivals = [acceptance_survival(tree, easy), acceptance_survival(tree, hard)]
    # alone, total tokens over total steps: about the harmonic mean
    alone = batch_acceptance(survivals, 1, 400)
    assert alone == pytest.approx(2 / (1 / a_easy + 1 / a_hard), rel=0.02)
    # together, both wait for the hard one, and for its unlucky draws
    together = batch_acceptance(survivals, 2, 400)
    assert a_hard * 0.95 < together < a_hard


def test_alike_prompts_still_lose_to_the_spread_of_their_step_counts():
    # the maximum of expected step counts would say batch 8 of identical prompts loses nothing
    tree = greedy_tree(np.full((3, 4), 0.2), 10)
    survival = acceptance_survival(tree, np.full((3, 4), 0.2))
    alone = batch_acceptance([survival] * 8, 1, 96)
    assert batch_acceptance([survival] * 8, 8, 96) < 0.97 * alone


def test_dynamic_survival_values_each_steps_own_tree():
    rng = np.random.default_rng(0)
    probs = np.sort(rng.dirichlet(np.ones(6), size=(5, 3))[..., :4], axis=-1)[..., ::-1]
    survival = dynamic_survival(probs, 8, calibrate=lambda p: p)
    own = np.mean([expected_acceptance(greedy_tree(p, 8), p) for p in probs])
    assert survival.sum() == pytest.approx(own)
    # a calibration that halves every probability makes every node worth less
    assert dynamic_survival(probs, 8, calibrate=lambda p: p / 2).sum() < survival.sum()


def test_calibration_learns_how_often_a_probability_is_right():
    rng = np.random.default_rng(1)
    probs = rng.random((4000, 2, 3))
    hits = (rng.random(probs.shape) < probs**2).astype(float)
    hits[:100, 1] = np.nan  # past the sequence's end: left out
    calibrate = probability_calibration(probs, hits)
    grid = np.array([[0.2, 0.5, 0.8], [0.3, 0.6, 0.9]])
    np.testing.assert_allclose(calibrate(grid), grid**2, atol=0.06)


def test_bad_inputs_are_refused():
    with pytest.raises(PerfkitError, match="survival curve"):
        simulated_steps([np.array([1.0, 0.2, 0.5])], 10)
    with pytest.raises(PerfkitError, match="batch must be >= 1"):
        batch_acceptance([np.array([1.0])], 0, 10)
    with pytest.raises(PerfkitError, match="positions, heads, topk"):
        probability_calibration(np.zeros((3, 2)), np.zeros((3, 2)))


def test_a_batch_attends_to_its_leading_sequence_as_the_decoder_pads_to_it():
    fast, slow = np.array([1.0, 1.0]), np.array([1.0])  # 2 tokens a step; 1 token a step
    # fast commits 0 then 2 before its two steps, then keeps 4; slow commits 0, 1, 2, 3
    assert attended_context([fast, slow], 2, 10, 4, draws=3) == pytest.approx(10 + (0 + 2 + 4 + 4) / 4)
    # alone, each attends to its own prefix: 2 + 6 cached tokens over 2 + 4 steps
    assert attended_context([fast, slow], 1, 10, 4, draws=3) == pytest.approx(10 + 8 / 6)
    # prompts that advance alike have no leader: the batch attends to what one would alone
    assert attended_context([slow, slow], 2, 10, 4) == attended_context([slow], 1, 10, 4) == 11.5
    with pytest.raises(PerfkitError, match="batch must be >= 1, got 0"):
        attended_context([slow], 0, 10, 4)
