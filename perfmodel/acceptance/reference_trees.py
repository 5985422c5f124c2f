"""The reference Medusa implementation's published trees, as data: its Vicuna-7B stage-2 tree and
its mc_sim_7b_63 tree, each in the order its greedy construction added the nodes, so every
prefix of the Vicuna-7B order is itself a tree.
"""

from __future__ import annotations

from perfmodel.acceptance.trees import Tree, TreePath
from perfmodel.base.errors import PerfkitError

# The reference implementation's Vicuna-7B stage-2 tree (63 nodes + root; its `vicuna_7b_stage2`, not its
# `mc_sim_7b_63`, with which it shares 55 nodes), in its order: the greedy construction's, most valuable node first,
# so every prefix is itself a tree.
VICUNA_7B_ORDER: tuple[TreePath, ...] = (
    (0,),
    (0, 0),
    (1,),
    (0, 1),
    (0, 0, 0),
    (1, 0),
    (2,),
    (0, 2),
    (0, 0, 1),
    (0, 3),
    (3,),
    (0, 1, 0),
    (2, 0),
    (4,),
    (0, 0, 2),
    (0, 4),
    (1, 1),
    (1, 0, 0),
    (0, 0, 0, 0),
    (5,),
    (0, 0, 3),
    (0, 5),
    (0, 2, 0),
    (3, 0),
    (0, 1, 1),
    (0, 6),
    (6,),
    (0, 7),
    (0, 0, 4),
    (4, 0),
    (1, 2),
    (0, 8),
    (7,),
    (0, 3, 0),
    (0, 0, 0, 1),
    (0, 0, 5),
    (2, 1),
    (0, 0, 6),
    (1, 0, 1),
    (0, 0, 1, 0),
    (2, 0, 0),
    (5, 0),
    (0, 9),
    (0, 1, 2),
    (8,),
    (0, 4, 0),
    (0, 2, 1),
    (1, 3),
    (0, 0, 7),
    (0, 0, 0, 2),
    (0, 0, 8),
    (1, 1, 0),
    (0, 1, 0, 0),
    (6, 0),
    (9,),
    (0, 1, 3),
    (0, 0, 0, 3),
    (1, 0, 2),
    (0, 5, 0),
    (3, 1),
    (0, 0, 2, 0),
    (7, 0),
    (1, 4),
)
VICUNA_7B_TREE = Tree(VICUNA_7B_ORDER)


# The reference implementation's `mc_sim_7b_63` (63 nodes + root), in its order, as published in
# FasterDecoding/Medusa, medusa/model/medusa_choices.py (commit 11af0aa503437b40d45f5a47c001c43699b7ae52).
MC_SIM_7B_63_ORDER: tuple[TreePath, ...] = (
    (0,),
    (0, 0),
    (1,),
    (0, 1),
    (2,),
    (0, 0, 0),
    (1, 0),
    (0, 2),
    (3,),
    (0, 3),
    (4,),
    (0, 4),
    (2, 0),
    (0, 5),
    (0, 0, 1),
    (5,),
    (0, 6),
    (6,),
    (0, 7),
    (0, 1, 0),
    (1, 1),
    (7,),
    (0, 8),
    (0, 0, 2),
    (3, 0),
    (0, 9),
    (8,),
    (9,),
    (1, 0, 0),
    (0, 2, 0),
    (1, 2),
    (0, 0, 3),
    (4, 0),
    (2, 1),
    (0, 0, 4),
    (0, 0, 5),
    (0, 0, 0, 0),
    (0, 1, 1),
    (0, 0, 6),
    (0, 3, 0),
    (5, 0),
    (1, 3),
    (0, 0, 7),
    (0, 0, 8),
    (0, 0, 9),
    (6, 0),
    (0, 4, 0),
    (1, 4),
    (7, 0),
    (0, 1, 2),
    (2, 0, 0),
    (3, 1),
    (2, 2),
    (8, 0),
    (0, 5, 0),
    (1, 5),
    (1, 0, 1),
    (0, 2, 1),
    (9, 0),
    (0, 6, 0),
    (0, 0, 0, 1),
    (1, 6),
    (0, 7, 0),
)
MC_SIM_7B_63_TREE = Tree(MC_SIM_7B_63_ORDER)


# The reference trees by the names their code gives them (EAGLE-1 drafts mc_sim_7b_63 too: its
# ea_model.py's default tree_choices, from its own copy of Medusa's choices).
REFERENCE_TREES = {"mc_sim_7b_63": MC_SIM_7B_63_TREE, "vicuna_7b_stage2": VICUNA_7B_TREE}


def reference_tree(name: str) -> Tree:
    """A reference tree by its name (REFERENCE_TREES), refused in one line naming those there are."""
    if name not in REFERENCE_TREES:
        raise PerfkitError(f"unknown reference tree {name!r}; the reference trees are: {', '.join(REFERENCE_TREES)}")
    return REFERENCE_TREES[name]


def vicuna_7b_prefix(nodes: int) -> Tree:
    """The first `nodes` nodes of the Vicuna-7B tree: the reference's own best tree of
    that size (at most 63 nodes)."""
    if not 0 < nodes <= len(VICUNA_7B_ORDER):
        raise PerfkitError(f"the Vicuna-7B tree has 1..{len(VICUNA_7B_ORDER)} nodes, asked for {nodes}")
    return Tree(VICUNA_7B_ORDER[:nodes])
