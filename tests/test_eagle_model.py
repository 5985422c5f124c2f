"""EAGLE in the performance model (issue 27): its step is its draft passes plus the tree
verification, priced op by op through the same latency source as Medusa's step; its
acceptance is a record's or the EAGLE-2 preset; `python -m perfmodel.speedup --drafter`
prices it, and `--drafter all` names the best drafter and tree per batch and context."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from perfmodel.acceptance.rates import (
    ACCEPTANCE_PRESETS,
    EAGLE_ACCEPTANCE,
    draft_model_improvement,
    drafter_acceptances,
    resolve_acceptance,
)
from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.hardware.specs import resolve_spec
from perfmodel.latency.eagle import DraftShape, EagleStep, draft_pass_ops
from perfmodel.latency.roofline import RooflineLatency
from perfmodel.latency.step import StepModel
from perfmodel.latency.tensor_parallel import TensorParallelStep
from perfmodel.latency.traced import TRACE_COLUMNS
from perfmodel.latency.traced_step import TracedStep
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.models.operators import Matmul, op_kernels
from perfmodel.planning.drafter_choice import best_drafters
from perfmodel.planning.drafters import DraftModelStep, drafters_for
from perfmodel.planning.simulations import SIMULATION_BATCHES, device_table, optima, speedup_table
from reports.commands.speedup import build_parser, main
from tests.conftest import deploy

LLAMA = load_model("llama-7b")
LATENCY = RooflineLatency(resolve_spec("a100"), LLAMA, "fp16")


def eagle(flavor: str = "full", **fields) -> EagleStep:
    return EagleStep(StepModel(LLAMA, LATENCY, flavor, with_heads=False), LLAMA, LATENCY, flavor, **fields)


def test_the_fc_is_a_2h_by_h_linear_op():
    h = LLAMA.hidden_size
    assert op_kernels("eagle_fc", "tree", LLAMA, 2, 512, 10) == (Matmul(1, 20, 2 * h, h, weight=True),)


def test_the_verification_is_the_tree_step_without_heads():
    ops = StepModel(LLAMA, LATENCY, "full", with_heads=False).op_times(1, 1024, 64)
    assert "medusa_heads" not in ops and "candidates" not in ops
    assert {"lm_head", "verify", "mask", "kv_move"} <= set(ops)  # it still verifies and commits the path
    plain = StepModel(LLAMA, LATENCY, "full")
    assert StepModel(LLAMA, LATENCY, "full", with_heads=False).step_time(1, 1024, 1) == plain.step_time(1, 1024, 1)


def test_the_step_is_the_draft_passes_plus_the_verification_op_by_op():
    """One point by hand: 24 tokens, depth 6, top-10 expansion -> passes over 1, 10, 10, 10,
    10, 10 tokens, each one layer, the embedding, the fc, the LM head and the top-k, its
    attention over the context plus the draft's tokens so far."""
    b, s, n = 2, 512, 24
    layer = ("norm", "norm", "qkv", "rope", "kv_write", "o", "residual", "residual", "gate_up", "act", "down")
    per_pass = (*layer, "embed", "eagle_fc", "lm_head", "draft_topk")
    assert sorted(o.op for o in draft_pass_ops(LLAMA, "full") for _ in range(o.count)) == sorted((*per_pass, "sdpa"))
    draft, drafted = 0.0, 0
    for tokens in (1, 10, 10, 10, 10, 10):
        drafted += tokens
        draft += sum(float(LATENCY.op_time(op, "tree", b, s, tokens)) for op in per_pass)
        draft += float(LATENCY.op_time("sdpa", "tree", b, s + drafted, tokens))
    verify = float(StepModel(LLAMA, LATENCY, "full", with_heads=False).step_time(b, s, n))
    step = eagle()
    assert float(step.draft_time(b, s, n)) == pytest.approx(draft, rel=1e-12)
    assert float(step.step_time(b, s, n)) == pytest.approx(draft + verify, rel=1e-12)
    assert step.step_time(b, s, 1) == pytest.approx(verify_plain := float(step.verify.step_time(b, s, 1)))
    assert float(step.draft_time(b, s, 1)) == 0.0 and verify_plain > 0


def test_the_tree_shape():
    shape = DraftShape()
    assert [int(t) for t in shape.pass_tokens(60)] == [1, 10, 10, 10, 10, 10]
    # a small budget: a tree of n tokens is at most n - 1 deep, and expands at most n - 1 nodes
    assert [int(t[0]) for t in shape.pass_tokens([4])] == [1, 3, 3]
    assert shape.depths([1, 2, 7, 8, 256]).tolist() == [0, 1, 6, 6, 6]
    with pytest.raises(PerfkitError, match="depth"):
        DraftShape(depth=0)


def test_deeper_trees_cost_more_drafting():
    step = eagle()
    drafts = [float(step.draft_time(1, 1024, 60, depth=d)) for d in range(1, 7)]
    assert all(a < b for a, b in zip(drafts, drafts[1:]))
    steps = [float(step.step_time(4, 1024, 60, depth=d)) for d in range(1, 7)]
    assert all(a < b for a, b in zip(steps, steps[1:]))
    # depth beyond n - 1 is no deeper
    assert step.draft_time(1, 1024, 4, depth=6) == step.draft_time(1, 1024, 4, depth=3)


def test_the_paper_step_drafts_one_layer_of_l():
    """The paper's step is one layer standing for each of the model's L: a pass is 1/L of it."""
    step = eagle("paper")
    paper = ("q", "k", "v", "qk", "pv", "up", "gate", "down")
    layer = sum(float(LATENCY.op_time(op, "tree", 1, 1024, 1)) for op in paper)
    assert float(step.draft_time(1, 1024, 2)) == pytest.approx(layer / LLAMA.num_layers, rel=1e-12)


class FlatAllReduce:
    """An all-reduce of 10 us whatever its size."""

    def time(self, nbytes, tp):
        return np.full(np.shape(nbytes), 1e-5)


def test_tensor_parallel_adds_two_all_reduces_and_a_logits_gather_per_pass():
    shard = LLAMA.shard(2)
    latency = RooflineLatency(resolve_spec("a100"), shard, "fp16")
    verify = StepModel(shard, latency, "full", with_heads=False)
    steps = [
        EagleStep(split, shard, latency, "full", DraftShape())
        for split in (verify, TensorParallelStep(verify, 2, FlatAllReduce(), "fp16", FlatAllReduce()))
    ]
    extra = steps[1].draft_time(1, 1024, [60, 4]) - steps[0].draft_time(1, 1024, [60, 4])
    # each pass: its two all-reduces, and the gather of the expanded nodes' logits (every pass expands some)
    assert extra == pytest.approx([6 * 3 * 1e-5, 3 * 3 * 1e-5])


def fake_trace(model, batch, context, candidates, dtype) -> pd.DataFrame:
    """Two memory-bound kernels: one of the forward, one drafting Medusa's candidates."""
    kernel = dict.fromkeys(TRACE_COLUMNS, 0) | {"kind": "copy", "bytes": 1e6}
    rows = [kernel | {"part": part} for part in ("forward", "candidates")]
    return pd.DataFrame(rows, columns=list(TRACE_COLUMNS))


def test_a_traced_verification_leaves_out_the_heads_candidates():
    medusa = TracedStep(LLAMA, LATENCY, "fp16", fake_trace)
    verify = TracedStep(LLAMA, LATENCY, "fp16", fake_trace, with_heads=False)
    priced = medusa.priced(1, 512, 8)
    kernel = priced["time_s"].iloc[0]
    assert medusa.step_time(1, 512, 8) == pytest.approx(2 * kernel)
    assert verify.step_time(1, 512, 8) == pytest.approx(kernel)
    assert verify.step_time(1, 512, 1) == medusa.step_time(1, 512, 1)  # a plain step drafts nothing


def test_the_eagle_preset_and_its_source():
    assert EAGLE_ACCEPTANCE(60) == pytest.approx(4.35)  # Spec-Bench: 4.35 tokens/step, 60 tokens
    assert EAGLE_ACCEPTANCE.formula() == "0.736 log2(n)"
    choice = ACCEPTANCE_PRESETS["eagle"]
    assert choice.drafter == "eagle" and "Spec-Bench" in choice.label


def test_each_drafter_takes_its_own_acceptance(tmp_path):
    both = drafter_acceptances(None, ["medusa", "eagle"])
    assert both["medusa"] is ACCEPTANCE_PRESETS["paper"] and both["eagle"] is ACCEPTANCE_PRESETS["eagle"]
    runs = [{"tree_size": n, "mean_accepted_tokens": a} for n, a in ((4, 2.1), (16, 3.0), (60, 3.9))]
    record = {"drafter": "eagle", "per_tree_size": runs}
    path = tmp_path / "acceptance-eagle.json"
    path.write_text(json.dumps(record))
    assert AcceptanceRecord.load(path).drafter == "eagle"
    chosen = drafter_acceptances(str(path), ["medusa", "eagle"])
    assert chosen["eagle"].drafter == "eagle" and chosen["eagle"].trees is None
    assert chosen["eagle"].model(16) == pytest.approx(3.0, abs=0.15)  # its log fit
    assert chosen["medusa"] is ACCEPTANCE_PRESETS["paper"]
    with pytest.raises(PerfkitError, match="of the eagle drafter, not of medusa"):
        drafter_acceptances(str(path), ["medusa"])
    assert resolve_acceptance("paper").drafter == "medusa"
    path.write_text('{"drafter": "lookahead", "per_tree_size": [{"tree_size": 2, "mean_accepted_tokens": 1.5}]}')
    with pytest.raises(PerfkitError, match="drafter must be one of medusa, eagle"):
        AcceptanceRecord.load(path)


class FlatStep:
    """A step whose time does not grow with the tokens verified (batch 1, memory-bound)."""

    label = "flat"

    def step_time(self, batch, seq_len, candidates=1):
        return np.ones(np.broadcast(batch, seq_len, candidates).shape)


def test_the_draft_model_where_verification_is_free_is_leviathans_formula():
    (drafter,) = drafters_for("draft", alpha=0.8, cost_ratio=0.05)
    table = speedup_table(DraftModelStep(FlatStep(), 0.05), drafter.acceptance, 1, 1024, drafter.sizes)
    gamma = table["tree_size"].to_numpy() - 1
    assert table["speedup"].to_numpy() == pytest.approx(draft_model_improvement(0.8, gamma, 0.05))


@pytest.fixture(scope="module")
def a100_all() -> pd.DataFrame:
    view = resolve_devices(["a100"])[0]
    return device_table(deploy(view, LLAMA, "fp16"), ("paper", "full"), drafters_for("all"))


def test_at_batch_1_eagle_beats_medusa_with_the_presets(a100_all):
    best = optima(a100_all[(a100_all["simulation"] == "b") & (a100_all["batch"] == 1)])
    for step in ("paper", "full"):
        speedup = best[best["step"] == step].set_index("drafter")["speedup"]
        # the numbers give EAGLE 3.42x (paper) / 3.22x (full) against Medusa's 2.60x / 2.52x
        assert speedup["eagle"] > speedup["medusa"] > 1
        row = best[(best["step"] == step) & (best["drafter"] == "eagle")].iloc[0]
        assert row["tree_size"] == 64 and row["depth"] == 6


def test_all_picks_the_best_drafter_per_setting(a100_all):
    chosen = best_drafters(a100_all)
    assert len(chosen) == 2 * (1 + len(SIMULATION_BATCHES) + 7)  # (a), (b) and (c) per step flavour
    for _, row in chosen.iterrows():
        speedups = {d: row[f"{d}_speedup"] for d in ("medusa", "eagle", "draft") if row[f"{d}_speculate"]}
        if not speedups:
            assert row["drafter"] == "off" and row["speedup"] == 1.0
        else:
            assert row["drafter"] == max(speedups, key=speedups.get) and row["speedup"] == max(speedups.values())
    at_1 = chosen[(chosen["simulation"] == "b") & (chosen["batch"] == 1)]
    assert set(at_1["drafter"]) == {"eagle"}


def test_the_cli_prints_the_best_drafter_per_batch(tmp_path, capsys):
    assert main(["--gpu", "a100", "--model", "llama-7b", "--drafter", "all", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the best drafter and tree per batch" in out
    per_batch = re.findall(r"^ +b=(\d+): +(EAGLE|Medusa|draft model|off)\b", out, flags=re.M)
    assert len(per_batch) == 2 * len(SIMULATION_BATCHES)  # one line per batch for each step flavour
    assert [int(b) for b, _ in per_batch[: len(SIMULATION_BATCHES)]] == list(SIMULATION_BATCHES)
    table = pd.read_csv(tmp_path / "speedup.csv")
    assert set(table["drafter"]) == {"medusa", "eagle", "draft"}
    assert not list(tmp_path.glob("*.png"))  # the figures are Medusa's


def test_eagle_alone_runs_the_simulations(tmp_path, capsys):
    argv = ["--gpu", "a100", "--model", "llama-7b", "--drafter", "eagle", "--step", "full", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "acc(n) = 0.736 log2(n)" in out and "tree of 64 tokens (depth 6)" in out and "EAGLE at b=1" in out
    assert set(pd.read_csv(tmp_path / "speedup.csv")["drafter"]) == {"eagle"}


def test_medusa_stays_the_default():
    assert build_parser().parse_args(["--gpu", "a100"]).drafter == "medusa"


def test_bad_drafter_input_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--gpu", "a100", "--drafter", "foo"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "invalid choice: 'foo'" in err
    assert run(main, ["--gpu", "a100", "--drafter", "medusa", "--acceptance-rates", "eagle"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "of the eagle drafter" in err
    # one EAGLE tree is priced since issue 59; a chain of no drafts is not
    assert run(main, ["--gpu", "a100", "--drafter", "eagle", "--chain", "0", "--acceleration", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--chain 0: a chain has at least one draft" in err
