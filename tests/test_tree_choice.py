import numpy as np
import pytest

from perfmodel.acceptance.trees import expected_acceptance, greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.tree_choice import choose_tree

ACCURACY = np.array([[0.6, 0.1, 0.05], [0.4, 0.1, 0.05], [0.3, 0.1, 0.05], [0.2, 0.1, 0.05]])


def acceptance(n: int) -> float:
    return expected_acceptance(greedy_tree(ACCURACY, n - 1), ACCURACY)


def test_the_best_predicted_speedup_wins_and_builds_its_tree():
    times = {1: 2.5e-3, 2: 3.0e-3, 4: 3.3e-3, 8: 3.6e-3, 16: 4.0e-3}
    choice = choose_tree(times, ACCURACY)
    speedups = {n: acceptance(n) * times[1] / t if n > 1 else 1.0 for n, t in times.items()}
    assert choice.size == max(speedups, key=speedups.get) == 8
    assert choice.speedup == pytest.approx(speedups[8])
    assert choice.tree(ACCURACY) == greedy_tree(ACCURACY, 7)


def test_plain_decoding_where_no_tree_beats_it():
    choice = choose_tree({1: 2.5e-3, 2: 5.0e-3, 4: 6.0e-3}, ACCURACY)
    assert choice.size == 1 and not choice.speculate and choice.tree(ACCURACY) is None
    assert "decoding plainly" in choice.describe()


def test_a_batch_that_waits_for_its_slowest_sequence_needs_a_cheaper_tree():
    times = {1: 2.5e-3, 2: 3.0e-3, 4: 3.3e-3, 8: 3.6e-3}
    alone = choose_tree(times, ACCURACY)
    waiting = choose_tree(times, ACCURACY, batch_efficiency={2: 0.8, 4: 0.7, 8: 0.6})
    assert alone.size == 8 and waiting.size == 2
    assert choose_tree(times, ACCURACY, batch_efficiency={2: 0.6, 4: 0.6, 8: 0.6}).size == 1
    assert waiting.table.set_index("tree_size").loc[8, "acceptance"] == pytest.approx(0.6 * acceptance(8))


def test_step_times_need_plain_decoding_and_positive_seconds():
    with pytest.raises(PerfkitError, match="need plain decoding"):
        choose_tree({2: 1e-3}, ACCURACY)
    with pytest.raises(PerfkitError, match="positive seconds"):
        choose_tree({1: 1e-3, 2: -1.0}, ACCURACY)
