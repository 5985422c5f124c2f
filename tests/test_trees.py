import itertools

import numpy as np
import pytest

from perfmodel.acceptance.reference_trees import VICUNA_7B_TREE
from perfmodel.acceptance.trees import (
    Tree,
    expected_acceptance,
    export_tree,
    greedy_tree,
    load_tree,
    max_nodes,
    optimal_tree,
)
from perfmodel.base.errors import PerfkitError


def all_trees(heads: int, topk: int, nodes: int):
    """Every prefix-closed tree of exactly `nodes` nodes (brute force, small cases only)."""
    universe = [p for d in range(1, heads + 1) for p in itertools.product(range(topk), repeat=d)]
    for subset in itertools.combinations(universe, nodes):
        chosen = set(subset)
        if all(len(p) == 1 or p[:-1] in chosen for p in subset):
            yield Tree(subset)


def random_accuracy(rng, heads, topk):
    a = np.sort(rng.uniform(0, 1, (heads, topk)), axis=1)[:, ::-1]
    return a / a.sum(axis=1, keepdims=True) * rng.uniform(0.3, 0.95, (heads, 1))  # ranks share one head's hit rate


@pytest.mark.parametrize("seed", range(6))
def test_exact_tree_is_the_brute_force_optimum_and_never_worse_than_greedy(seed):
    rng = np.random.default_rng(seed)
    heads, topk = 2 + seed % 2, 3
    accuracy = random_accuracy(rng, heads, topk)
    if seed % 3 == 0:
        accuracy = rng.uniform(0, 1, (heads, topk))  # unsorted ranks too
    for nodes in range(1, 6):
        brute = max(expected_acceptance(t, accuracy) for t in all_trees(heads, topk, nodes))
        exact = optimal_tree(accuracy, nodes)
        greedy = greedy_tree(accuracy, nodes)
        assert len(exact.paths) == len(greedy.paths) == nodes
        assert expected_acceptance(exact, accuracy) == pytest.approx(brute)
        assert expected_acceptance(exact, accuracy) >= expected_acceptance(greedy, accuracy) - 1e-12


@pytest.mark.parametrize("seed", range(5))
def test_greedy_is_optimal_under_the_independence_model(seed):
    # Values only shrink along a path, so the n best nodes always form a tree.
    accuracy = np.random.default_rng(seed).uniform(0, 1, (4, 10))
    for nodes in (1, 5, 17, 64, 200):
        gap = expected_acceptance(optimal_tree(accuracy, nodes), accuracy) - expected_acceptance(
            greedy_tree(accuracy, nodes), accuracy
        )
        assert abs(gap) < 1e-9


@pytest.mark.parametrize("nodes", [1, 16, 63, 120])
def test_large_budgets(nodes):
    accuracy = random_accuracy(np.random.default_rng(7), 4, 10)
    exact, greedy = optimal_tree(accuracy, nodes), greedy_tree(accuracy, nodes)
    assert len(exact.paths) == nodes and exact.depth <= 4 and exact.max_rank < 10
    assert expected_acceptance(exact, accuracy) >= expected_acceptance(greedy, accuracy) - 1e-12


def test_budget_beyond_the_complete_tree():
    accuracy = np.full((2, 2), 0.5)
    assert (
        max_nodes(2, 2) == 6
        and len(optimal_tree(accuracy, 50).paths) == 6
        and len(greedy_tree(accuracy, 50).paths) == 6
    )


def test_engine_formats_round_trip():
    for engine in ("reference", "tensorrt-llm", "vllm"):
        exported = export_tree(VICUNA_7B_TREE, engine)
        assert len(exported) == 63 and load_tree(str(exported)) == VICUNA_7B_TREE
    assert export_tree(VICUNA_7B_TREE, "tensorrt-llm")[1] == [1]
    with pytest.raises(PerfkitError, match="unknown engine"):
        export_tree(VICUNA_7B_TREE, "sglang")


def test_bad_accuracy():
    with pytest.raises(PerfkitError, match="probabilities"):
        optimal_tree([[1.5, 0.1]], 3)


def test_every_prefix_of_the_vicuna_tree_is_a_tree():
    from perfmodel.acceptance.reference_trees import VICUNA_7B_ORDER, VICUNA_7B_TREE, vicuna_7b_prefix

    sizes = [vicuna_7b_prefix(n).size for n in range(1, len(VICUNA_7B_ORDER) + 1)]
    assert sizes == list(range(2, 65))
    assert vicuna_7b_prefix(63) == VICUNA_7B_TREE
    with pytest.raises(PerfkitError, match="1..63 nodes, asked for 64"):
        vicuna_7b_prefix(64)


def test_dense_tree_is_the_cartesian_product_of_the_heads_top_k():
    from perfmodel.acceptance.trees import dense_tree

    tree = dense_tree([3, 2, 1])
    assert len(tree.paths) == 3 + 3 * 2 + 3 * 2 * 1 and tree.depth == 3
    assert (2, 1, 0) in tree.paths and tree.max_rank == 2
    with pytest.raises(PerfkitError, match=r"k >= 1.*\[2, 0\]"):
        dense_tree([2, 0])


def test_random_dense_settings_are_distinct_and_within_the_node_limit():
    from perfmodel.acceptance.trees import dense_tree, random_dense_settings

    settings = random_dense_settings(12, 4, 10, 128, seed=3)
    assert len(set(settings)) == 12
    assert all(1 <= len(s) <= 4 and all(1 <= k <= 10 for k in s) for s in settings)
    assert all(len(dense_tree(s).paths) <= 128 for s in settings)
    assert random_dense_settings(12, 4, 10, 128, seed=3) == settings  # seeded
    with pytest.raises(PerfkitError, match="only 3 dense trees of at most 2 nodes"):
        random_dense_settings(5, 2, 10, 2)
