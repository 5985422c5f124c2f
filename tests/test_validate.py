"""The closed loop on a tiny run: predicted and measured speedups side by side."""

import pandas as pd
import pytest

from perfmodel.errors import PerfkitError
from perfmodel.validate import ValidateConfig, main


def test_validate_writes_predicted_and_measured_speedup_per_tree(tmp_path, capsys):
    out = tmp_path / "validate.csv"
    code = main(["--sizes", "2", "8", "--prompts", "2", "--new-tokens", "12", "--budget", "0.02", "--csv", str(out), "--ops-csv", str(tmp_path / "ops.csv")])
    assert code == 0
    df = pd.read_csv(out)
    assert list(df["tree_size"]) == [2, 8]
    for column in ("predicted_speedup", "measured_speedup", "predicted_acceptance", "measured_acceptance", "error"):
        assert df[column].notna().all()
    assert (df["measured_speedup"] > 0).all() and df["lossless"].all()
    # reports match a closed-loop file to their device and model by these columns
    from profilers.device import this_cpu_key

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
    assert "host overhead" in printed and "max |predicted - measured|" in printed and "where a step's time goes" in printed


def test_validate_sets_its_thread_count_only_while_it_runs():
    import torch

    from perfmodel.validate import torch_threads

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
