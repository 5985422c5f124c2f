"""The closed loop on a tiny run: predicted and measured speedups side by side."""

import numpy as np
import pandas as pd
import pytest

from perfmodel.base.errors import PerfkitError
from profilers.closed_loop.config import ValidateConfig
from reports.commands.validate import main


def test_validate_writes_predicted_and_measured_speedup_per_tree(tmp_path, capsys):
    out = tmp_path / "validate.csv"
    code = main(
        [
            "--sizes",
            "2",
            "8",
            "--batch",
            "1",
            "2",
            "--prompts",
            "2",
            "--new-tokens",
            "12",
            "--budget",  # a few samples a point: the timings' quality is not what is checked here
            "0.001",
            "--rounds",  # two timed passes, not the default 16 batches a setting (tested below): not read here
            "2",
            "--csv",
            str(out),
            "--ops-csv",
            str(tmp_path / "ops.csv"),
        ]
    )
    assert code == 0
    df = pd.read_csv(out)
    assert list(df["tree_size"]) == [2, 8, 2, 8] and list(df["batch"]) == [1, 1, 2, 2]
    assert set(df["tree_kind"]) == {"static"} and set(df["acceptance_scheme"]) == {"greedy"}
    # a batch steps until its slowest sequence is done: it makes less of each step than one sequence alone
    assert (df["measured_batch_acceptance"] <= df["measured_acceptance"] + 1e-9).all()
    assert (df["predicted_batch_acceptance"] <= df["predicted_acceptance"] + 1e-9).all()
    # Greedy steps replayed through the heads' predictions on the plain pass are the decoder's
    # steps, prompt by prompt, at every batch: the acceptance carries no error of its own.
    np.testing.assert_allclose(df["predicted_batch_acceptance"], df["measured_batch_acceptance"], rtol=1e-12)
    np.testing.assert_allclose(df["predicted_acceptance"], df["measured_acceptance"], rtol=1e-12)
    # beside it, what the head accuracies alone predict, and the speedup error that would give
    assert df["accuracy_batch_acceptance"].notna().all() and np.isfinite(df["accuracy_error"]).all()
    for column in ("predicted_speedup", "measured_speedup", "predicted_acceptance", "measured_acceptance", "error"):
        assert df[column].notna().all()
    assert (df["measured_speedup"] > 0).all() and df["lossless"].all()
    # the error column is the relative error of the two speedups, a finite number
    assert np.isfinite(df["error"]).all()
    np.testing.assert_allclose(df["error"], df["predicted_speedup"] / df["measured_speedup"] - 1, rtol=1e-9, atol=1e-12)
    # host overhead is calibrated once on plain decoding: the same seconds added to every tree's operators
    for _, one in df.groupby("batch"):
        np.testing.assert_allclose(
            one["predicted_step_s"] - one["ops_step_s"],
            (one["predicted_step_s"] - one["ops_step_s"]).iloc[0],
            rtol=1e-9,
            atol=1e-12,
        )
    # the predicted speedup is the batch's acceptance over the tree step's time against one plain
    # step, the same for every tree of a batch (how close it comes is measured by the command,
    # not asserted here: the suite runs on loaded machines)
    plain = df["predicted_speedup"] * df["predicted_step_s"] / df["predicted_batch_acceptance"]
    for _, one in plain.groupby(df["batch"]):
        np.testing.assert_allclose(one, one.iloc[0], rtol=1e-9)
    # reports match a closed-loop file to their device and model by these columns
    from perfmodel.hardware.cpu_identity import this_cpu_key

    assert set(df["device"]) == {this_cpu_key()} and set(df["model"]) == {"bundled"} and set(df["dtype"]) == {"fp32"}
    # Acceptance predicted from head accuracies measured on the plain run, never from Medusa runs.
    assert (df["predicted_acceptance"] > 1).all()
    ops = pd.read_csv(tmp_path / "ops.csv")
    assert {"sdpa", "lm_head", "medusa_heads", "candidates", "verify", "kv_move"} <= set(ops["op"])
    assert (ops["source"] == "measured").all()
    # where the time goes, per decoder phase, measured and predicted
    for phase in ("candidates", "forward", "verification", "kv_update"):
        assert (df[f"measured_{phase}_s"] > 0).all() and (df[f"predicted_{phase}_s"] >= 0).all()
    printed = capsys.readouterr().out
    assert (
        "host overhead" in printed and "max |predicted - measured|" in printed and "where a step's time goes" in printed
    )


def test_validate_sets_its_thread_count_only_while_it_runs():
    import torch

    from profilers.device import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_validate_refuses_bad_settings():
    with pytest.raises(PerfkitError, match=">= 2"):
        ValidateConfig(sizes=(1, 4))
    with pytest.raises(PerfkitError, match="cpu or cuda"):
        ValidateConfig(device="tpu")
    with pytest.raises(PerfkitError, match="threads must be >= 1"):
        ValidateConfig(threads=0)
    with pytest.raises(PerfkitError, match="acceptance must be one of greedy, typical, got 'rejection'"):
        ValidateConfig(acceptance="rejection")


def test_validate_typical_acceptance_and_dynamic_trees(tmp_path, capsys):
    out = tmp_path / "schemes.csv"
    args = ["--sizes", "4", "--prompts", "2", "--new-tokens", "12", "--budget", "0.001", "--rounds", "1"]
    assert main([*args, "--acceptance", "typical", "--dynamic", "--csv", str(out)]) == 0
    df = pd.read_csv(out).set_index("tree_kind")
    assert set(df.index) == {"static", "dynamic"} and set(df["acceptance_scheme"]) == {"typical"}
    # typical acceptance is not greedy decoding's text, so nothing is claimed lossless
    assert df["lossless"].isna().all()
    # only the dynamic tree pays for building a tree every step, and its prediction carries it
    assert df.loc["static", "dynamic_tree_build_s"] == 0 and df.loc["dynamic", "dynamic_tree_build_s"] > 0
    assert df.loc["dynamic", "predicted_candidates_s"] > df.loc["static", "predicted_candidates_s"]
    assert np.isfinite(df["error"]).all() and (df["predicted_acceptance"] > 1).all()
    printed = capsys.readouterr().out
    assert "measured_dynamic_over_static" in printed and "tree_build_ms" in printed


def test_operator_rounds_are_taken_between_the_batches_of_the_decoding_runs():
    from decoder.checkpoint import load_checkpoint
    from decoder.medusa import Decoder
    from decoder.runs import heldout_prompts
    from profilers.closed_loop.predict import step_contexts
    from profilers.closed_loop.runs import timed_runs
    from profilers.closed_loop.untimed import untimed_passes

    ckpt = load_checkpoint("bundled")
    config = ValidateConfig(sizes=(4,), batch=2, prompts=3, prompt_len=16, new_tokens=6, rounds=2)
    decoder, prompts = Decoder(ckpt), heldout_prompts(ckpt, 3, 16, 0)
    record = untimed_passes(decoder, prompts, config, lambda text: None)
    calls = []
    runs = timed_runs(decoder, prompts, config, record, lambda text: None, between=calls.append)
    # two rounds over three prompts two at a time: four batches, each followed by its share
    assert calls == [4, 4, 4, 4]
    assert [(r["tree_kind"], r["tree_size"]) for r in runs] == [("plain", 1), ("static", 4)]
    # plain steps attend to the mean context; a batch's tree steps to its leader's, never less than alone
    contexts = step_contexts(record, config)
    assert contexts["plain", 1] == config.context and 16 <= contexts["static", 4] <= 16 + 6


def test_calibration_notes_explain_a_negative_offset_and_warn_only_of_drift():
    from profilers.closed_loop.compare import calibration_notes

    steady = {
        "plain_step_s": 4e-3,
        "decoded_plain_step_s": 4.1e-3,
        "ops_plain_step_s": 4.4e-3,
        "host_overhead_s": -4e-4,
    }
    (note,) = calibration_notes(steady)
    assert note.startswith("note:") and "10% more than the step itself" in note
    drifted = {**steady, "decoded_plain_step_s": 4.6e-3, "ops_plain_step_s": 3.8e-3, "host_overhead_s": 2e-4}
    (warning,) = calibration_notes(drifted)
    assert warning.startswith("warning:") and "differ by +15%" in warning


def test_every_batch_size_decodes_enough_batches_of_prompts_by_default():
    assert [ValidateConfig(batch=b).decode_rounds for b in (1, 2, 4, 8, 16)] == [2, 2, 4, 8, 16]
    assert ValidateConfig(batch=3, prompts=10).decode_rounds == 4  # 4 batches a pass, 16 in 4 passes
    assert ValidateConfig(batch=8, rounds=1).decode_rounds == 1  # as asked
    with pytest.raises(PerfkitError, match="rounds must be >= 1, got 0"):
        ValidateConfig(rounds=0)


def test_the_operator_points_a_closed_loop_times_need_no_latency_source():
    from perfmodel.latency.step import op_points, step_inventory
    from perfmodel.models.config import load_model

    model = load_model("bundled")
    points = op_points(model, "reference", 2, [40, 50], [1, 4])  # a plain step, and a 4-token tree step
    assert len(points) == len(set(points))  # each point once, however many calls run at it
    plain = {op for op, *point in points if point == ["decode", 2, 40, 1]}
    assert plain == {item.op for item in step_inventory(model, "reference", medusa=False)}
    assert ("sdpa", "tree", 2, 54, 4) in points  # fused attention spans the context and the tree
    assert ("medusa_heads", "decode", 2, 50, 1) in points  # the heads read one token per sequence


def test_by_default_every_setting_decodes_sixteen_batches_in_two_rounds_at_least():
    assert ValidateConfig(prompts=2, batch=1).decode_rounds == 8
    assert ValidateConfig(prompts=16, batch=8).decode_rounds == 8
    assert ValidateConfig(prompts=64, batch=2).decode_rounds == 2
    assert ValidateConfig(prompts=2, rounds=3).decode_rounds == 3
