"""How many tokens a batch makes of each step: replayed and simulated step counts, survival curves."""

import numpy as np
import pytest

from perfmodel.acceptance.batching import (
    acceptance_survival,
    accepted_lengths,
    attended_context,
    batch_acceptance,
    dynamic_survival,
    probability_calibration,
    replayed_tokens,
    simulated_tokens,
    step_counts,
)
from perfmodel.acceptance.trees import Tree, expected_acceptance, greedy_tree
from perfmodel.base.errors import PerfkitError


def simulated(survivals, new_tokens, draws=2000):
    return simulated_tokens(survivals, new_tokens, draws)


def test_survival_curve_adds_up_to_the_expected_acceptance():
    accuracy = np.array([[0.5, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.05]])
    tree = greedy_tree(accuracy, 12)
    survival = acceptance_survival(tree, accuracy)
    assert survival[0] == 1 and (np.diff(survival) <= 0).all()
    assert survival.sum() == pytest.approx(expected_acceptance(tree, accuracy))


def test_a_step_never_emits_past_the_token_budget():
    # every step accepts exactly 3 tokens: 10 tokens take 4 steps, the last one cut to 1
    steps = step_counts(simulated([np.array([1.0, 1.0, 1.0])], 10, draws=5), 10)
    assert (steps == 4).all()
    assert batch_acceptance(simulated([np.array([1.0, 1.0, 1.0])], 10), 1, 10) == pytest.approx(10 / 4)


def test_a_batch_waits_for_its_slowest_prompt():
    tree = greedy_tree(np.full((2, 3), 0.5), 3)
    easy, hard = np.full((2, 3), 0.3), np.full((2, 3), 0.05)
    a_easy, a_hard = expected_acceptance(tree, easy), expected_acceptance(tree, hard)
    survivals = [acceptance_survival(tree, easy), acceptance_survival(tree, hard)]
    # alone, total tokens over total steps: about the harmonic mean
    alone = batch_acceptance(simulated(survivals, 400), 1, 400)
    assert alone == pytest.approx(2 / (1 / a_easy + 1 / a_hard), rel=0.02)
    # together, both wait for the hard one, and for its unlucky draws
    together = batch_acceptance(simulated(survivals, 400), 2, 400)
    assert a_hard * 0.95 < together < a_hard


def test_alike_prompts_still_lose_to_the_spread_of_their_step_counts():
    # the maximum of expected step counts would say batch 8 of identical prompts loses nothing
    tree = greedy_tree(np.full((3, 4), 0.2), 10)
    survival = acceptance_survival(tree, np.full((3, 4), 0.2))
    generations = simulated([survival] * 8, 96)
    assert batch_acceptance(generations, 8, 96) < 0.97 * batch_acceptance(generations, 1, 96)


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
        simulated([np.array([1.0, 0.2, 0.5])], 10)
    with pytest.raises(PerfkitError, match="batch must be >= 1"):
        batch_acceptance(simulated([np.array([1.0])], 10), 0, 10)
    with pytest.raises(PerfkitError, match="needs as many recorded positions, got 3"):
        replayed_tokens([np.zeros(3, int)], 4)
    with pytest.raises(PerfkitError, match=r"hits must be \(positions, heads, topk\)"):
        accepted_lengths(Tree(((0,),)), np.zeros((3, 2)))
    with pytest.raises(PerfkitError, match="positions, heads, topk"):
        probability_calibration(np.zeros((3, 2)), np.zeros((3, 2)))


def test_a_batch_attends_to_its_leading_sequence_as_the_decoder_pads_to_it():
    fast, slow = np.array([1.0, 1.0]), np.array([1.0])  # 2 tokens a step; 1 token a step
    # fast commits 0 then 2 before its two steps, then keeps 4; slow commits 0, 1, 2, 3
    both = simulated([fast, slow], 4, draws=3)
    assert attended_context(both, 2, 10, 4) == pytest.approx(10 + (0 + 2 + 4 + 4) / 4)
    # alone, each attends to its own prefix: 2 + 6 cached tokens over 2 + 4 steps
    assert attended_context(both, 1, 10, 4) == pytest.approx(10 + 8 / 6)
    # prompts that advance alike have no leader: the batch attends to what one would alone
    slow_ones = simulated([slow, slow], 4)
    assert attended_context(slow_ones, 2, 10, 4) == attended_context(slow_ones[:1], 1, 10, 4) == 11.5
    with pytest.raises(PerfkitError, match="batch must be >= 1, got 0"):
        attended_context(slow_ones, 0, 10, 4)


def hit_record(ranks, heads=3, topk=4):
    """hits (positions, heads, topk) where head k was right at rank ranks[i][k] (-1: at none)."""
    hits = np.zeros((len(ranks), heads, topk))
    for i, row in enumerate(ranks):
        for k, rank in enumerate(row):
            if rank >= 0:
                hits[i, k, rank] = 1
    return hits


def test_a_greedy_step_accepts_the_right_predictions_while_they_stay_in_the_tree():
    tree = Tree(((0,), (1,), (0, 0), (0, 1), (0, 0, 0)))
    hits = hit_record(
        [
            [0, 0, 0],  # the whole chain
            [0, 1, 0],  # (0, 1) is a leaf: head 3's right guess has no node under it
            [1, 0, 0],  # (1, 0) is not in the tree
            [2, 0, 0],  # head 1 right only at a rank the tree lacks
            [-1, 0, 0],  # head 1 wrong: nothing past the root, whatever the others say
            [0, -1, 0],
        ]
    )
    np.testing.assert_array_equal(accepted_lengths(tree, hits), [3, 2, 1, 0, 0, 1])
    hits[0, 2] = np.nan  # head 3's token lies past the end of the text: a miss
    assert accepted_lengths(tree, hits)[0] == 2


def test_a_replay_starts_each_step_where_the_last_one_stopped():
    # 6 tokens: a step after token 0 takes 1 + 2; the ones it skips (1, 2) never start a
    # step, so their long runs do not count; then 1 + 0 after token 3, 1 + 1 after token 4
    generations = replayed_tokens([np.array([2, 5, 5, 0, 1, 0])], 6)
    np.testing.assert_array_equal(generations[0], [[3, 4, 6, 7, 8, 9]])
    assert step_counts(generations, 6).tolist() == [[3]]
    assert batch_acceptance(generations, 1, 6) == pytest.approx(6 / 3)


def test_a_replayed_batch_waits_for_the_prompt_whose_hard_stretch_falls_where_its_steps_start():
    # Both prompts' heads are right at half the positions, so their accuracies agree; one
    # alternates right/wrong and accepts 2 tokens every step, the other's right half comes
    # all at the end (after its budget runs out) and accepts nothing until then.
    even = np.array([1, 0] * 8)
    late = np.array([0] * 8 + [1] * 8)
    generations = replayed_tokens([even, late], 8)
    assert step_counts(generations, 8).tolist() == [[4], [8]]
    assert batch_acceptance(generations, 2, 8) == pytest.approx(1.0)
    assert batch_acceptance(generations, 1, 8) == pytest.approx(16 / 12)
