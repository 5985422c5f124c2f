"""Step latency model, acceptance fits and calibration from measured rows."""

import json

import numpy as np
import pandas as pd
import pytest

from perfmodel.acceptance.rates import (
    PAPER_ACCEPTANCE,
    PAPER_LN_ACCEPTANCE,
    HeadAccuracyAcceptance,
    LogAcceptance,
    draft_model_improvement,
    draft_model_tokens,
    fit_log_acceptance,
    models_from_record,
)
from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import find_spec
from perfmodel.latency.calibration import MeasuredLatency, fit_roofline
from perfmodel.latency.roofline import RooflineLatency
from perfmodel.latency.step import StepModel, step_inventory
from perfmodel.measured.contract import ContractPoint, contract_fields
from perfmodel.models.config import load_model
from perfmodel.models.operators import op_cost

LLAMA = load_model("llama-7b")
A100 = find_spec("a100")


def roofline_step(flavor="full", params=RooflineParams()):
    return StepModel(LLAMA, RooflineLatency(A100, LLAMA, "fp16", params), flavor)


def test_paper_step_is_the_simplified_block_of_appendix_g():
    ops = [s.op for s in step_inventory(LLAMA, "paper", medusa=True)]
    assert ops == ["q", "k", "v", "qk", "pv", "up", "gate", "down"]


def test_full_step_counts_every_layer_and_adds_medusa_work_only_to_tree_steps():
    plain = {s.name: s.count for s in step_inventory(LLAMA, "full", medusa=False)}
    tree = {s.name: s.count for s in step_inventory(LLAMA, "full", medusa=True)}
    assert plain["qkv"] == plain["gate_up"] == plain["down"] == 32 and plain["norm"] == 64 and plain["lm_head"] == 1
    # Engines fuse q/k/v and gate/up; the reference decoder runs them apart, as its checkpoint stores them.
    assert not {"q", "k", "v", "gate", "up"} & set(plain)
    reference = {s.name for s in step_inventory(LLAMA, "reference", medusa=False)}
    assert {"q", "k", "v", "gate", "up"} <= reference and not {"qkv", "gate_up"} & reference
    assert set(tree) - set(plain) == {"medusa_heads", "candidates", "kv_move", "mask"}
    # The reference decoder builds its mask and commits the accepted path in plain steps too.
    reference_plain = {s.name for s in step_inventory(LLAMA, "reference", medusa=False)}
    assert {"mask", "kv_move"} <= reference_plain and not {"medusa_heads", "candidates"} & reference_plain


def test_plain_decode_step_of_llama_7b_is_bound_by_reading_the_weights():
    # fp16 7B at batch 1: ~13.5 GB of weights at 1935 GB/s x 0.88 is ~7.9 ms; the full step
    # adds the KV cache, the kernels' overheads and the small ops.
    t = float(roofline_step().step_time(1, 1024, 1))
    weights_s = 2 * 6.74e9 / (A100.bandwidth * 0.88)
    assert weights_s < t < 1.35 * weights_s


def test_step_time_broadcasts_and_matches_pointwise_calls():
    step = roofline_step()
    grid = step.step_time(np.array([[1], [8]]), 1024, np.array([1, 16, 64]))
    assert grid.shape == (2, 3)
    assert grid[1, 2] == pytest.approx(float(step.step_time(8, 1024, 64)))
    assert (np.diff(grid, axis=1) >= 0).all()  # more candidates never cost less


def test_breakdown_shares_sum_to_one_and_name_the_largest_op():
    df = roofline_step().breakdown(1, 1024, 64)
    assert df["share"].sum() == pytest.approx(1.0)
    assert df.iloc[0]["op"] in ("gate_up", "down")


def test_bad_step_inputs_are_refused():
    with pytest.raises(PerfkitError, match="flavor"):
        StepModel(LLAMA, RooflineLatency(A100, LLAMA, "fp16"), "bogus")
    with pytest.raises(PerfkitError, match=">= 1"):
        roofline_step().step_time(0, 1024, 1)


def test_log_fit_recovers_known_coefficients_and_reports_its_error():
    n = np.array([2, 4, 8, 16, 32, 64])
    fit = fit_log_acceptance(n, 1.1 + 0.4 * np.log(n))
    assert fit.a == pytest.approx(1.1, abs=1e-6) and fit.b == pytest.approx(0.4, abs=1e-6)
    assert fit.error.max_abs_pct < 1e-4 and fit.error.points == 6
    assert "1.100 + 0.400 ln(n)" in fit.describe()


def test_paper_preset_and_floor_at_one_token():
    # the paper's 0.477 log(n) read as log2 (docs/acceptance.md): 2.86 tokens/step at 64
    assert PAPER_ACCEPTANCE(64) == pytest.approx(0.477 * np.log2(64))
    assert PAPER_ACCEPTANCE(1) == 1.0  # the root is always accepted
    assert LogAcceptance(1.0, 0.5)(np.e) == pytest.approx(1.5)


def test_the_clamp_of_a_log_curve_is_known():
    # 0.477 log2 n < 1 below n = 2^(1/0.477) = 4.28: the paper's curve is held at 1 there
    assert PAPER_ACCEPTANCE.clamped_below() == pytest.approx(2 ** (1 / 0.477))
    assert PAPER_ACCEPTANCE(4) == 1.0 and PAPER_ACCEPTANCE(5) > 1.0
    # read as ln, 0.477 ln n < 1 below n = e^(1/0.477) = 8.14
    assert PAPER_LN_ACCEPTANCE.clamped_below() == pytest.approx(np.exp(1 / 0.477))
    assert PAPER_LN_ACCEPTANCE(8) == 1.0 and PAPER_LN_ACCEPTANCE(9) > 1.0
    assert LogAcceptance(1.135, 0.404).clamped_below() == 1.0  # an intercept above 1 never clamps


def test_acceptance_inputs_are_checked():
    with pytest.raises(PerfkitError, match="distinct tree sizes"):
        fit_log_acceptance([4, 4], [2.0, 2.1])
    with pytest.raises(PerfkitError, match=">= 1"):
        PAPER_ACCEPTANCE(0)
    with pytest.raises(PerfkitError, match="alpha"):
        draft_model_tokens(1.5, 4)


def test_head_accuracy_model_equals_expected_acceptance_of_its_tree():
    acc = np.array([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1]])
    model = HeadAccuracyAcceptance(acc)
    # 3 tokens: root + (0,) + (0,0) = 1 + 0.6 + 0.6*0.5
    assert model(3) == pytest.approx(1.9)
    assert model(1) == pytest.approx(1.0)
    assert HeadAccuracyAcceptance(acc, exact=True)(5) >= model(5) - 1e-12


def test_draft_model_formulas_match_hand_values():
    assert draft_model_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert draft_model_tokens(1.0, 4) == 5.0
    assert draft_model_improvement(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)


def test_models_from_a_decoder_record(tmp_path):
    record = {
        "head_topk_accuracy": [[0.5, 0.2], [0.4, 0.2]],
        "per_tree_size": [
            {"tree_size": n, "mean_accepted_tokens": m} for n, m in ((1, 1.0), (2, 1.5), (3, 1.7), (4, 1.9))
        ],
    }
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(record))
    log, heads = models_from_record(AcceptanceRecord.load(path))
    assert heads.error.max_abs_pct < 1.0  # 1.5, 1.7, 1.9 are exactly the greedy trees' values
    assert log.error.points == 4
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(PerfkitError, match="per_tree_size"):
        AcceptanceRecord.load(tmp_path / "bad.json")


def synthetic_rows(params: RooflineParams, grid=((1, 4, 16), (128, 1024), (1,))):
    """Rows 'measured' on a device that behaves exactly like a roofline with `params`."""
    truth = RooflineLatency(A100, LLAMA, "fp16", params)
    rows = []
    for op in ("q", "up", "down", "qk", "pv", "lm_head"):
        for phase in ("decode", "prefill"):
            for b in grid[0]:
                for s in grid[1]:
                    t = float(truth.op_time(op, phase, b, s, 1))
                    rows.append(
                        contract_fields(
                            ContractPoint("a100-pcie", LLAMA.name, "fp16", op, phase, b, s),
                            op_cost(op, phase, LLAMA, "fp16", b, s),
                            t,
                            "measured",
                            0.01,
                        )
                    )
    return pd.DataFrame(rows)


def test_measured_latency_is_exact_at_measured_points_and_between_them_in_log_space():
    rows = synthetic_rows(RooflineParams())
    source = MeasuredLatency(rows, "llama-7b", "fp16")
    for r in rows.sample(10, random_state=0).itertuples():
        assert source.op_time(r.op, r.phase, r.batch, r.seq_len, r.candidates)[0] == pytest.approx(r.time_s)
    t1, t4, t2 = (source.op_time("up", "decode", b, 128, 1)[0] for b in (1, 4, 2))
    assert t2 == pytest.approx(np.sqrt(t1 * t4))
    assert source.outside("up", "decode", 64, 128, 1) and not source.outside("up", "decode", 2, 128, 1)
    with pytest.raises(PerfkitError, match="no sdpa/tree"):
        source.op_time("sdpa", "tree", 1, 128, 16)


def test_fitted_roofline_recovers_the_device_parameters_from_its_measurements():
    true = RooflineParams(0.6, 0.7, 8e-6)
    latency, report = fit_roofline(synthetic_rows(true), A100, LLAMA, "fp16")
    assert latency.params.compute_efficiency == pytest.approx(0.6, rel=0.02)
    assert latency.params.memory_efficiency == pytest.approx(0.7, rel=0.02)
    assert latency.params.kernel_overhead_s == pytest.approx(8e-6, rel=0.05)
    assert report.heldout_rows > 0 and report.heldout_median_abs_pct < 1.0


def test_calibration_needs_measured_rows_of_the_model():
    rows = synthetic_rows(RooflineParams())
    with pytest.raises(PerfkitError, match="no measured rows for model"):
        MeasuredLatency(rows, "llama-13b", "fp16")
