"""The closed loop with EAGLE drafting: the replay gives the decoder's steps exactly, the step
is priced as the decoder drafts (StaticTreeDraft) and the drafting's host overhead is fitted on
drafts timed alone, never on an EAGLE decoding run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from decoder.eagle import CONTEXT
from decoder.eagle_tree import History
from perfmodel.acceptance.batching import conditional_accuracy
from perfmodel.acceptance.trees import Tree
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import resolve_spec
from perfmodel.latency.eagle import EagleStep, StaticTreeDraft, draft_points
from perfmodel.latency.roofline import RooflineLatency
from perfmodel.latency.step import StepModel
from perfmodel.models.config import load_model
from profilers.closed_loop.config import ValidateConfig
from profilers.closed_loop.eagle import PROBE_TREES, DraftHost, draft_work
from reports.commands.validate import main

TREE = Tree(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))  # passes: (1, 1), (3, 2), (6, 1)
LLAMA = load_model("llama-7b")
LATENCY = RooflineLatency(resolve_spec("a100"), LLAMA, "fp16")


def test_eagle_closed_loop_replays_the_steps_and_prices_the_drafting(tmp_path, capsys):
    out = tmp_path / "eagle.csv"
    args = ["--drafter", "eagle", "--sizes", "4", "--batch", "1", "2", "--prompts", "2", "--new-tokens", "12"]
    args += ["--budget", "0.001", "--rounds", "1"]
    assert main([*args, "--csv", str(out), "--ops-csv", str(tmp_path / "o.csv")]) == 0
    df = pd.read_csv(out)
    assert set(df["drafter"]) == {"eagle"} and list(df["tree_size"]) == [4, 4] and df["lossless"].all()
    # the drafter's chain along the plain text gives the decoder's steps exactly, at every batch
    np.testing.assert_allclose(df["predicted_batch_acceptance"], df["measured_batch_acceptance"], rtol=1e-12)
    # the drafting is priced: its ops and its host overhead, in the candidates part of the step
    assert (df["predicted_candidates_s"] > df["draft_host_s"]).all() and (df["draft_host_s"] != 0).all()
    # the prediction is the batch's acceptance over the step's time against one plain step per
    # batch (how close it comes is the command's measurement, not asserted on a loaded machine)
    assert np.isfinite(df["error"]).all()
    plain = df["predicted_speedup"] * df["predicted_step_s"] / df["predicted_batch_acceptance"]
    assert (plain > 0).all() and np.isfinite(plain).all()
    ops = pd.read_csv(tmp_path / "o.csv")
    assert {"eagle_fc", "draft_topk", "lm_head", "verify", "kv_move"} <= set(ops["op"])
    assert "medusa_heads" not in set(ops["op"]) and "candidates" not in set(ops["op"])  # no heads run
    printed = capsys.readouterr().out
    assert "drafting's host overhead" in printed and "candidates is the drafting" in printed


def test_the_eagle_loop_refuses_what_it_cannot_replay():
    with pytest.raises(PerfkitError, match="replays greedy steps over static trees: .*--acceptance typical"):
        ValidateConfig(drafter="eagle", acceptance="typical")
    with pytest.raises(PerfkitError, match="without --dynamic"):
        ValidateConfig(drafter="eagle", dynamic=True)
    with pytest.raises(PerfkitError, match="drafter must be one of medusa, eagle, got 'draft'"):
        ValidateConfig(drafter="draft")
    with pytest.raises(PerfkitError, match="--drafter eagle is for the real closed loop"):
        main(["--weights", "dummy", "--replay", "r.json", "--drafter", "eagle"])


def test_a_static_tree_is_priced_as_the_decoder_drafts_it():
    """Pass j runs the window and every node down to depth j, attending among them only (no
    draft KV cache, no cache write), and the LM head and top-k read the nodes it expands."""
    assert TREE.draft_passes == ((1, 1), (3, 2), (6, 1))
    shape = StaticTreeDraft((TREE,), window=4)
    step = EagleStep(StepModel(LLAMA, LATENCY, "reference", with_heads=False), LLAMA, LATENCY, "reference", shape)
    layer = ("norm", "norm", "norm", "q", "k", "v", "rope", "o", "residual", "residual", "gate", "up", "act", "down")
    by_hand = 0.0
    for run, expanded in TREE.draft_passes:
        tokens = 4 + run
        by_hand += sum(float(LATENCY.op_time(op, "tree", 2, tokens, tokens)) for op in (*layer, "embed", "eagle_fc"))
        by_hand += sum(float(LATENCY.op_time(op, "tree", 2, tokens, tokens)) for op in ("sdpa", "mask"))
        by_hand += sum(float(LATENCY.op_time(op, "tree", 2, tokens, expanded)) for op in ("lm_head", "draft_topk"))
    assert float(step.draft_time(2, 512, TREE.size)) == pytest.approx(by_hand, rel=1e-12)
    points = draft_points(LLAMA, "reference", shape, 2, 512, [TREE.size])
    assert ("lm_head", "tree", 2, 7, 2) in points and ("sdpa", "tree", 2, 10, 10) in points
    assert not any(op == "kv_write" for op, *_ in points)
    assert float(step.draft_time(2, 512, 1)) == 0.0  # plain decoding drafts nothing
    with pytest.raises(PerfkitError, match="no static tree of 9 tokens to draft; the trees priced have 7 tokens"):
        step.draft_time(1, 512, 9)
    with pytest.raises(PerfkitError, match="a static tree's depth is its own"):
        step.draft_time(1, 512, 7, depth=2)
    with pytest.raises(PerfkitError, match="window must be an integer >= 0, got -1"):
        StaticTreeDraft((TREE,), window=-1)


def test_the_drafting_host_overhead_is_a_least_squares_fit_on_the_probes():
    probes = StaticTreeDraft(PROBE_TREES, CONTEXT)
    # one draft of 1, 2, 4 and 5 passes: far enough apart to fit a draft and a pass
    assert draft_work(probes, [t.size for t in PROBE_TREES]).tolist() == [[1, 1], [1, 2], [1, 4], [1, 5]]
    step = EagleStep(StepModel(LLAMA, LATENCY, "reference", with_heads=False), LLAMA, LATENCY, "reference", probes)
    priced = step.draft_time(3, 512, [t.size for t in PROBE_TREES])
    measured = priced + 4e-4 - np.array([1, 2, 4, 5]) * 1e-5  # a pass's ops timed alone may cost more than in it
    host = DraftHost.fit(step, probes, 3, 512, measured)
    assert host.per_draft == pytest.approx(4e-4) and host.per_pass == pytest.approx(-1e-5)
    assert max(abs(r) for r in host.residuals) < 1e-12
    run = StaticTreeDraft((TREE,), CONTEXT)
    assert host.seconds(run, [1, TREE.size]).tolist() == pytest.approx([0.0, 4e-4 - 3e-5])


def test_conditional_accuracy_counts_a_depth_where_the_shallower_ones_came():
    nan = np.nan
    hits = np.array(
        [
            [[1, 0], [0, 1]],  # depth 1 rank 0, depth 2 rank 1
            [[0, 0], [1, 0]],  # depth 1 missed: its depth 2 is not counted
            [[0, 1], [nan, nan]],  # depth 2 past the end
        ]
    )
    accuracy = conditional_accuracy(hits)
    np.testing.assert_allclose(accuracy[0], [1 / 3, 1 / 3])
    np.testing.assert_allclose(accuracy[1], [0, 1])


def test_the_drafters_history_keeps_what_was_pushed():
    """The decoder overwrites its last hidden state in place; the window must keep the value
    it had (a view of it became the next position's feature, a bug the closed loop found)."""
    history = History.empty(1)
    state = torch.zeros(1, 4)
    history.push(0, state[0:1], [7])
    state[0] = 1.0
    history.push(0, torch.full((1, 4), 2.0), [8])
    features, tokens = history.inputs(0)
    assert tokens == [8] and features[0].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_reports_keep_eagle_closed_loops_apart_from_the_heads():
    """An EAGLE run is evidence for EAGLE's trees, never for the heads' decision map; the
    drafters' section states it first."""
    from perfmodel.measured.store import stored_closed_loops
    from reports.drafter_prose import measured_drafting_text
    from reports.sources import load_validation

    key = "cpu-amd-epyc-2c"
    eagle_runs = stored_closed_loops(key, drafter="eagle")
    assert [p.name for p in eagle_runs] == ["validate-bundled-eagle-run2.csv", "validate-bundled-eagle-run3.csv"]
    both = stored_closed_loops(key) + eagle_runs
    heads = load_validation(both, key, "bundled")
    drafted = load_validation(both, key, "bundled", "eagle")
    assert len(heads) and len(drafted) == 30 and set(drafted["drafter"]) == {"eagle"}
    assert "drafter" not in heads or set(heads["drafter"].fillna("medusa")) == {"medusa"}
    text = measured_drafting_text(drafted, key)
    assert text.startswith("Measured first, on cpu-amd-epyc-2c") and "0.16x to 0.84x plain decoding" in text
    assert "3.5% (validate-bundled-eagle-run2.csv), 6.4% (validate-bundled-eagle-run3.csv)" in text
    with pytest.raises(PerfkitError, match="closed loops are stored for drafters medusa, eagle, not 'draft'"):
        stored_closed_loops(key, drafter="draft")
