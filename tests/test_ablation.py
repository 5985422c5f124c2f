"""python -m decoder.ablation: the paper's Fig. 4 measured and predicted on a tiny run."""

import json

import pandas as pd
import pytest

from decoder.ablation import AblationConfig, main
from perfmodel.acceptance.ablation import dense_against_sparse
from perfmodel.acceptance.trees import Tree
from perfmodel.base.errors import PerfkitError


def test_ablation_measures_and_predicts_dense_and_sparse_trees(tmp_path, capsys):
    out = tmp_path / "fig4.csv"
    args = ["--dense", "2", "--sparse-nodes", "2", "4", "--max-nodes", "6", "--prompts", "2", "--new-tokens", "12"]
    assert main([*args, "--csv", str(out)]) == 0
    table = pd.read_csv(out)
    assert sorted(table["kind"].value_counts().items()) == [("dense", 2), ("sparse", 2)]
    for row in table.itertuples():
        tree = Tree(tuple(tuple(p) for p in json.loads(row.paths)))
        assert len(tree.paths) == row.nodes == row.tree_size - 1 <= 6 and tree.depth == row.depth
    assert list(table.loc[table["kind"] == "sparse", "setting"]) == ["greedy-2", "greedy-4"]
    # the step time is predicted from a calibration apart from the runs compared with it
    assert (table["predicted_step_s"] != table["measured_step_s"]).all()
    pd.testing.assert_series_equal(
        table["speedup_error"], table["predicted_speedup"] / table["measured_speedup"] - 1, check_names=False
    )
    assert (table["measured_acceptance"] >= 1).all() and (table["predicted_acceptance"] > 1).all()
    assert set(table["model"]) == {"bundled"} and table["device"].notna().all()
    printed = capsys.readouterr().out
    assert "dense trees against the sparse curve" in printed and "prediction error" in printed


def test_dense_against_sparse_reads_the_sparse_curve_at_equal_candidates():
    table = pd.DataFrame(
        {
            "kind": ["sparse", "sparse", "dense", "dense"],
            "setting": ["greedy-4", "greedy-8", "top-6", "top-20"],
            "nodes": [4, 8, 6, 20],
            "measured_acceptance": [2.0, 3.0, 2.0, 2.5],
            "measured_speedup": [1.5, 2.0, 1.4, 1.0],
        }
    )
    versus = dense_against_sparse(table)
    assert list(versus["setting"]) == ["top-6"]  # 20 candidates lie past the sparse curve
    assert versus["acceptance_vs_sparse"].iloc[0] == pytest.approx(2.0 / 2.5 - 1)
    assert versus["speedup_vs_sparse"].iloc[0] == pytest.approx(1.4 / 1.75 - 1)


def test_ablation_refuses_trees_past_its_node_limit():
    with pytest.raises(PerfkitError, match=r"1 to max_nodes \(8\) nodes; got \[4, 16\]"):
        AblationConfig(sparse_nodes=(4, 16), max_nodes=8)
