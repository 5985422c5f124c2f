import itertools

import numpy as np
import pytest
import torch

from decoder.medusa import dynamic_tree
from perfmodel.acceptance.trees import greedy_tree


@pytest.mark.parametrize("seed", range(40))
def test_dynamic_tree_is_the_greedy_tree_of_the_steps_probabilities(seed):
    rng = np.random.default_rng(seed)
    heads, vocab = int(rng.integers(1, 4)), int(rng.integers(4, 12))
    topk = int(rng.integers(2, vocab))
    logits = torch.tensor(rng.normal(0, 3, (heads, vocab)), dtype=torch.float32)
    if seed % 4 == 0:
        logits = logits.round()  # ties between ranks
    probs = torch.softmax(logits, dim=-1)
    top = probs.topk(topk, dim=-1).values.double().numpy()
    nodes = int(rng.integers(0, 30))
    tree = dynamic_tree(probs, nodes, topk)
    assert tree == greedy_tree(top, nodes)
    # Independently of any construction: no path left out is more likely than one kept.
    paths = [p for d in range(1, heads + 1) for p in itertools.product(range(topk), repeat=d)]
    joint = {p: float(np.prod([top[k, r] for k, r in enumerate(p)])) for p in paths}
    assert len(tree.paths) == min(nodes, len(paths))
    kept = set(tree.paths)
    if kept and len(kept) < len(paths):
        assert min(joint[p] for p in kept) >= max(joint[p] for p in paths if p not in kept) - 1e-12
