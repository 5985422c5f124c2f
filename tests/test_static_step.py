"""The static Medusa step (decoder.static_step): the batch's step as tensor ops, lossless
against the eager decoder in every regime a CPU runs, the same distribution under
rejection sampling, no host read and no kernel per sequence inside the step (its cache is
checked against a full recompute in tests/test_decoder.py, beside the eager one's)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from decoder.acceptance import AcceptanceConfig
from decoder.batched_acceptance import StaticTree, verify_greedy, verify_rejection
from decoder.trace import trace_step
from decoder.tree import Drafting, tree_buffers
from decoder.twin import Replay
from perfmodel.acceptance.reference_trees import VICUNA_7B_TREE
from perfmodel.acceptance.trees import Tree
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.models.config import load_model
from profilers.step_bench import main as step_bench_main
from tests.distilled import PROMPTS

TREES = ({"drafting": Drafting(VICUNA_7B_TREE)}, {"drafting": Drafting(Tree.breadth_first(20, 3))})


@pytest.mark.parametrize("batch", [1, 4])
def test_the_static_step_decodes_greedy_exactly_as_the_eager_loop(decoder, batch):
    prompts = PROMPTS[:batch]
    plain = decoder.generate(prompts, 40)
    assert decoder.generate(prompts, 40, launch="static").tokens == plain.tokens
    for kwargs in TREES:
        eager = decoder.generate(prompts, 40, **kwargs)
        static = decoder.generate(prompts, 40, launch="static", **kwargs)
        assert static.tokens == plain.tokens
        assert static.path_lengths == eager.path_lengths  # the same path at every step
        assert static.steps == eager.steps < plain.steps
    typical = AcceptanceConfig("typical")
    for kwargs in TREES:
        eager = decoder.generate(prompts, 40, acceptance=typical, **kwargs)
        assert decoder.generate(prompts, 40, acceptance=typical, launch="static", **kwargs).tokens == eager.tokens


def test_the_compiled_step_is_lossless_too(decoder):
    prompts = PROMPTS[:2]
    plain = decoder.generate(prompts, 24)
    compiled = decoder.generate(prompts, 24, drafting=Drafting(VICUNA_7B_TREE), launch="compiled")
    assert compiled.tokens == plain.tokens
    assert compiled.path_lengths == decoder.generate(prompts, 24, drafting=Drafting(VICUNA_7B_TREE)).path_lengths


def test_a_replayed_static_run_keeps_the_recorded_lengths(decoder):
    recorded = [[3, 1, 2], [2, 2]]
    result = decoder.generate(
        PROMPTS[:2], 12, drafting=Drafting(VICUNA_7B_TREE), replay=Replay(recorded), launch="static"
    )
    eager = decoder.generate(PROMPTS[:2], 12, drafting=Drafting(VICUNA_7B_TREE), replay=Replay(recorded))
    assert result.path_lengths == eager.path_lengths
    assert result.path_lengths[0][:3] == [3, 1, 2] and result.path_lengths[1][:2] == [2, 2]


def test_batched_rejection_sampling_keeps_the_models_distribution():
    # tests/test_decoder.py's example: root children propose tokens 2 and 0; token 2 has a child (token 1).
    tree = StaticTree.of(tree_buffers(Tree(((0,), (1,), (0, 0))), heads=2, topk=2))
    rows = 40000
    candidates = torch.tensor([3, 2, 0, 1]).expand(rows, -1)
    logits = torch.log(
        torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
    ).expand(rows, -1, -1)
    verdict = verify_rejection(
        candidates, logits, tree, AcceptanceConfig("rejection", 1.0), torch.Generator().manual_seed(0)
    )
    emitted = torch.cat([candidates.gather(1, verdict.path), verdict.next_root[:, None]], dim=1)
    first = torch.where(verdict.length > 1, emitted[:, 1], verdict.next_root)
    np.testing.assert_allclose(np.bincount(first.numpy(), minlength=4) / rows, [0.1, 0.2, 0.3, 0.4], atol=0.01)
    after_2 = first == 2  # node 1 accepted (a rejected draft's token is out of the residual)
    second = torch.where(verdict.length[after_2] > 2, emitted[after_2, 2], verdict.next_root[after_2])
    np.testing.assert_allclose(np.bincount(second.numpy(), minlength=4) / after_2.sum().item(), [0.25] * 4, atol=0.02)
    assert set(verdict.length.tolist()) == {1, 2, 3}


def test_batched_greedy_takes_the_first_of_the_longest_paths():
    tree = StaticTree.of(tree_buffers(Tree(((0,), (1,), (0, 0))), heads=2, topk=2))
    # the model's argmax is token 5 at the root and token 7 at node 1: both root children
    # would need 5, so node 1 (token 5) is kept, then node 3 (token 7)
    logits = torch.zeros(2, 4, 8)
    logits[:, 0, 5] = logits[:, 1, 7] = logits[:, 3, 1] = 1.0
    candidates = torch.tensor([[0, 5, 5, 7], [0, 2, 5, 7]])
    verdict = verify_greedy(candidates, logits, tree, AcceptanceConfig())
    assert verdict.length.tolist() == [3, 2]
    assert verdict.path.tolist() == [[0, 1, 3], [0, 2, 0]]
    assert verdict.next_root.tolist() == [1, 0]


def test_the_static_step_launches_the_same_kernels_at_every_batch_and_reads_nothing_back():
    model = load_model("llama-7b")
    traces = {b: trace_step(model, b, 512, 16, launch=Launch.STATIC) for b in (1, 8)}
    assert len(traces[1]) == len(traces[8])
    assert not (traces[8]["kind"] == "host_sync").any()
    eager = {b: trace_step(model, b, 512, 16) for b in (1, 8)}
    assert len(eager[8]) > len(eager[1])  # sequence by sequence: verification and commit per sequence
    assert (eager[8]["kind"] == "host_sync").sum() == 8 * (eager[1]["kind"] == "host_sync").sum()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"launch": "graph"}, "needs a CUDA device"),
        ({"launch": "static", "drafting": Drafting(dynamic_nodes=6)}, "dynamic tree"),
        ({"launch": "warp"}, "unknown launch regime 'warp'"),
    ],
)
def test_what_a_static_regime_cannot_run_is_refused_in_one_line(decoder, kwargs, message):
    with pytest.raises(PerfkitError, match=message):
        decoder.generate(PROMPTS[:1], 4, **kwargs)


def test_the_step_benchmark_prints_kernels_and_python_time_per_step(capsys, tmp_path):
    out = tmp_path / "bench.csv"
    assert step_bench_main(["--batch", "1", "4", "--tree-size", "4", "--rounds", "1", "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "python_ms_per_step" in printed and f"wrote {out}" in printed
    table = pd.read_csv(out).set_index(["launch", "batch"])["kernels_per_step"]
    assert table[("static", 1)] == table[("static", 4)]  # the batch's step, not a step per sequence
    assert table[("eager", 4)] > table[("eager", 1)]
